"""Nested differentiated loops: plan the inner loops, then the outer one on them.

When a scanned body runs a scan of its own, differentiation splits both: the
outer forward body holds the inner forward scan, whose stacks it returns among
its residuals (stacked again over the outer iterations), and the outer backward
body holds the inner backward scan, which reads their slices. One iteration of
the outer pair is then a flat program of its own, the *joint body*: the forward
body's equations followed by the backward body's, where each residual slice the
backward body reads is the forward body's value itself (slice ``i`` of a stack is
iteration ``i``'s in both loops). In it the inner pair is an ordinary pair
(:func:`remat._jax.loops.find_loops`), so the whole machinery applies to it,
recursively for deeper nests.

A choice of the inner loops rewrites the joint body; split back
(:func:`split_joint`), every value of the forward part that the backward part
reads becomes a residual of the outer pair: constants and scanned-over arrays
are passed as they are, anything else is stacked. On the pair so rewritten the
outer loop's own choices are planned (:func:`remat.core.loops.loop_choices`); a
:class:`remat.core.loops.NestedChoice` holds both, and the outer frontier is the
Pareto frontier over a few spread combinations of the inner choices.

Example::

    >>> import jax, jax.numpy as jnp
    >>> from remat._jax.inline import inline_calls
    >>> def loss(ws, x):
    ...     inner = lambda c, w: (jnp.tanh(c @ w) + c, None)
    ...     outer = lambda c, wl: (jax.lax.scan(inner, c, wl)[0], None)
    ...     return jnp.sum(jax.lax.scan(outer, x, ws)[0])
    >>> flat = inline_calls(jax.make_jaxpr(jax.grad(loss))(jnp.ones((3, 4, 8, 8)),
    ...                                                    jnp.ones((2, 8))))
    >>> [(n.length, [m.length for m in n.inner]) for n in plan_nests(flat.jaxpr)]
    [(3, [4])]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from remat._jax.compat import core
from remat._jax.loops import (BodyMap, LoopPair, backward_with, find_loops, fresh_var,
                              live_eqns, loop_body, rewrite_pair, unnamed)
from remat.core.loops import LoopChoice, NestedChoice, combine, loop_choices, pareto, spread

__all__ = ["Joint", "LoopNest", "Variant", "joint_body", "split_joint", "plan_nests",
           "rewrite_nests", "own_choice"]

#: Combinations of the inner loops' choices the outer loop is planned on (spread
#: along their combined frontier, from "as written" to "stack the least").
INNER_VARIANTS = 32


@dataclasses.dataclass(frozen=True)
class Joint:
    """One iteration of a pair as a flat jaxpr (see the module).

    Attributes:
      jaxpr: the joint body: constants of both bodies, then the forward body's
        arguments and the backward body's that are not residual slices; the
        forward body's equations, then the backward body's; out, the forward
        body's outputs that are not residuals, then the backward body's.
      fwd, bwd: the pair's two equations.
      pair: the pair.
    """
    jaxpr: core.Jaxpr
    fwd: core.JaxprEqn
    bwd: core.JaxprEqn
    pair: LoopPair


def _parts(eqn):
    return eqn.params["num_consts"], eqn.params["num_carry"]


def joint_body(fwd: core.JaxprEqn, bwd: core.JaxprEqn, pair: LoopPair) -> Joint:
    """The joint body of ``pair`` (equations ``fwd`` and ``bwd``)."""
    fbody, bbody = fwd.params["jaxpr"].jaxpr, bwd.params["jaxpr"].jaxpr
    bnc, bncarry = _parts(bwd)
    residual = {fwd.outvars[p]: fbody.outvars[p] for p in pair.positions}
    subst, b_invars = {}, []
    for k, v in enumerate(bbody.invars):
        outer = bwd.invars[k]
        if k >= bnc + bncarry and isinstance(outer, core.Var) and outer in residual:
            subst[v] = residual[outer]
        else:
            b_invars.append(v)
    sub = lambda v: subst.get(v, v) if isinstance(v, core.Var) else v
    b_eqns = [e.replace(invars=[sub(v) for v in e.invars]) for e in bbody.eqns]
    eqns = [*fbody.eqns, *b_eqns]
    outvars = [v for p, v in enumerate(fbody.outvars) if p not in pair.positions]
    outvars += [sub(v) for v in bbody.outvars]
    jaxpr = core.Jaxpr([*fbody.constvars, *bbody.constvars], [*fbody.invars, *b_invars],
                       outvars, eqns, effects=core.join_effects(*(e.effects for e in eqns)),
                       debug_info=unnamed(fbody.debug_info))
    return Joint(jaxpr, fwd, bwd, pair)


def split_joint(joint: Joint, jaxpr: core.Jaxpr) -> tuple[core.JaxprEqn, core.JaxprEqn,
                                                         tuple[int, ...]]:
    """``(fwd, bwd, positions)``: the pair's equations rebuilt from its joint body
    as rewritten (``jaxpr``: same invars, the same number of forward equations
    first), and the positions of the forward scan's new residual stacks.

    The backward body reads the forward part's values it needs as: the forward
    loop's constants (passed as constants), slices of the arrays it scans over
    (passed as arrays to scan over), its closed-over constants (copied), and any
    other value stacked by the forward loop."""
    fwd, bwd, pair = joint.fwd, joint.bwd, joint.pair
    fclosed, bclosed = fwd.params["jaxpr"], bwd.params["jaxpr"]
    fbody, bbody = fclosed.jaxpr, bclosed.jaxpr
    fnc, fncarry = _parts(fwd)
    bnc, bncarry = _parts(bwd)
    nf = len(fbody.eqns)
    f_eqns, b_eqns = jaxpr.eqns[:nf], jaxpr.eqns[nf:]
    kept_outs = len(fbody.outvars) - len(pair.positions)
    b_outvars = jaxpr.outvars[kept_outs:]
    in_forward = set(fbody.constvars) | set(fbody.invars)
    in_forward.update(v for e in f_eqns for v in e.outvars)
    cross = []
    for v in [*(v for e in b_eqns for v in e.invars), *b_outvars]:
        if isinstance(v, core.Var) and v in in_forward and v not in cross:
            cross.append(v)
    const_of = dict(zip(fbody.constvars, fclosed.consts))
    consts_in = dict(zip(fbody.invars[:fnc], fwd.invars[:fnc]))
    xs_in = dict(zip(fbody.invars[fnc + fncarry:], fwd.invars[fnc + fncarry:]))
    env = {}
    closed_vars, closed_vals, new_consts, new_consts_in = [], [], [], []
    new_xs, new_xs_in, stacked = [], [], []
    length = fwd.params["length"]
    for v in cross:
        env[v] = fresh_var(v)
        if v in const_of:
            closed_vars.append(env[v])
            closed_vals.append(const_of[v])
        elif v in consts_in:
            new_consts.append(env[v])
            new_consts_in.append(consts_in[v])
        elif v in xs_in:
            new_xs.append(env[v])
            new_xs_in.append(xs_in[v])
        else:
            stacked.append(v)
    # Forward: the outputs that are not residuals, then one stack per value read.
    f_outvars = [v for p, v in enumerate(fbody.outvars) if p not in pair.positions]
    f_outvars += stacked
    new_fbody = fbody.replace(eqns=live_eqns(fbody.replace(eqns=f_eqns), f_outvars),
                              outvars=f_outvars,
                              debug_info=unnamed(fbody.debug_info))
    stacks = [core.Var(core.unmapped_aval(length, 0, v.aval)) for v in stacked]
    f_out = [v for p, v in enumerate(fwd.outvars) if p not in pair.positions] + stacks
    new_fwd = fwd.replace(outvars=f_out, params=dict(
        fwd.params, jaxpr=core.ClosedJaxpr(new_fbody, fclosed.consts)))
    positions = tuple(range(len(f_out) - len(stacks), len(f_out)))
    # Backward: its own operands but the old residuals, then the new ones.
    stack_slices = [env[v] for v in stacked]
    sub = lambda v: env.get(v, v) if isinstance(v, core.Var) else v
    body_eqns = [e.replace(invars=[sub(v) for v in e.invars]) for e in b_eqns]
    residuals = {fwd.outvars[p] for p in pair.positions}
    keep = [k for k in range(bnc + bncarry, len(bwd.invars))
            if not (isinstance(bwd.invars[k], core.Var) and bwd.invars[k] in residuals)]
    b_outs = [sub(v) for v in b_outvars]
    new_bwd = backward_with(
        bwd, live_eqns(bbody.replace(eqns=body_eqns), b_outs), b_outs, keep,
        closure=(closed_vars, closed_vals), consts=(new_consts, new_consts_in),
        xs=(new_xs + stack_slices, new_xs_in + stacks))
    return new_fwd, new_bwd, positions


# --------------------------------------------------------------------- planning

@dataclasses.dataclass(frozen=True)
class Variant:
    """The pair as one combination of inner choices rewrote it (``inner`` empty:
    as written), and the planning view of its forward body."""
    inner: tuple
    fwd: core.JaxprEqn
    bwd: core.JaxprEqn
    pair: LoopPair
    bmap: BodyMap


@dataclasses.dataclass(frozen=True)
class LoopNest:
    """One differentiated loop, with the loops nested in it, planned.

    Attributes:
      pair: the pair, where it is in the jaxpr it was found in.
      fwd: its forward equation as written (for its source line).
      inner: the nests of its joint body (empty for a loop holding none).
      variants: the pair under the combinations of inner choices planned on.
      frontier: its choices, least recompute first: :class:`LoopChoice` for a
        loop holding no loop, else :class:`NestedChoice` (``variant`` indexes
        ``variants``).
    """
    pair: LoopPair
    fwd: core.JaxprEqn
    inner: tuple[LoopNest, ...]
    variants: tuple[Variant, ...]
    frontier: tuple

    @property
    def length(self) -> int:
        return self.fwd.params["length"]

    def variant(self, choice) -> Variant:
        return self.variants[choice.variant if isinstance(choice, NestedChoice) else 0]


def plan_nests(jaxpr: core.Jaxpr) -> list[LoopNest]:
    """The differentiated loops of ``jaxpr`` (:func:`find_loops`), each with its
    frontier of choices, the loops in their bodies planned first (recursively)."""
    nests = []
    for pair in find_loops(jaxpr):
        fwd, bwd = jaxpr.eqns[pair.forward], jaxpr.eqns[pair.backward]
        written = Variant((), fwd, bwd, pair, loop_body(jaxpr, pair))
        joint = joint_body(fwd, bwd, pair)
        inner = tuple(plan_nests(joint.jaxpr))
        if not inner:
            nests.append(LoopNest(pair, fwd, (), (written,), loop_choices(written.bmap.body)))
            continue
        lengths = tuple(n.length for n in inner)
        chain = combine([n.frontier for n in inner], lengths)
        variants, choices = [], []
        for k in spread(len(chain), INNER_VARIANTS):
            picked = tuple(n.frontier[i] for n, i in zip(inner, chain[k]))
            if not any(chain[k]):
                variant = dataclasses.replace(written, inner=picked)
            else:
                f, b, positions = split_joint(joint, rewrite_nests(joint.jaxpr, inner, picked))
                moved = LoopPair(pair.forward, pair.backward, positions)
                eqns = list(jaxpr.eqns)
                eqns[pair.forward], eqns[pair.backward] = f, b
                variant = Variant(picked, f, b, moved,
                                  loop_body(jaxpr.replace(eqns=eqns), moved))
            choices += [NestedChoice(c, picked, lengths, len(variants))
                        for c in loop_choices(variant.bmap.body)]
            variants.append(variant)
        nests.append(LoopNest(pair, fwd, inner, tuple(variants),
                              pareto(fwd.params["length"], choices)))
    return nests


def rewrite_nests(jaxpr: core.Jaxpr, nests: Sequence[LoopNest],
                  choices: Sequence) -> core.Jaxpr:
    """``jaxpr`` with each nest's pair rewritten as its choice says (inner loops
    included)."""
    eqns = list(jaxpr.eqns)
    for nest, choice in zip(nests, choices):
        v = nest.variant(choice)
        own = own_choice(choice)
        f, b = v.fwd, v.bwd
        if own.rebuilt:
            f, b = rewrite_pair(f, b, v.pair, v.bmap, own)
        eqns[nest.pair.forward], eqns[nest.pair.backward] = f, b
    return jaxpr.replace(eqns=eqns)


def own_choice(choice) -> LoopChoice:
    """The part of ``choice`` about its own loop (not the loops inside)."""
    return choice.outer if isinstance(choice, NestedChoice) else choice

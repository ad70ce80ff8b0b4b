"""Differentiated loops in a flat jaxpr: find them, and rewrite what they stack.

In a differentiated program a ``scan`` runs twice: the forward ``scan`` returns,
besides its carry and outputs, one stack per residual (leading axis: the trip
count), and a later ``scan`` (the backward one, running the other way) takes
those stacks among the arrays it scans over. A :class:`LoopPair` is such a
forward/backward couple; the stacks it may drop are those the backward scan alone
reads.

:func:`rewrite_loops` drops the residual stacks a :class:`remat.core.loops.LoopChoice`
rebuilds: the forward body stops returning them (its dead equations go), and the
backward body starts with the forward body's equations that make them, fed at each
iteration from the forward loop's constants, the slices of the arrays it scans
over, the residuals still stacked and, where needed, the stacked carry (a new
output of the forward scan). Slice ``i`` of every stack is iteration ``i``'s in
both loops, whatever their directions, so the rebuilt values are exactly the
dropped ones.

Example::

    >>> import jax, jax.numpy as jnp
    >>> from remat._jax.inline import inline_calls
    >>> def loss(ws, x):
    ...     body = lambda c, w: (jnp.tanh(jnp.tanh(c @ w) @ w.T) + c, None)
    ...     return jnp.sum(jax.lax.scan(body, x, ws)[0])
    >>> flat = inline_calls(jax.make_jaxpr(jax.grad(loss))(jnp.ones((4, 8, 8)),
    ...                                                    jnp.ones((2, 8))))
    >>> [(p.forward, p.backward, len(p.positions)) for p in find_loops(flat.jaxpr)]
    [(0, 2, 6)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from remat._jax.compat import core
from remat._jax.compat_graph import source_line
from remat._jax.op_model import primitive_cost
from remat.core.graph import Graph, GraphBuilder
from remat.core.loops import LoopBody, LoopChoice

__all__ = ["LoopPair", "BodyMap", "find_loops", "loop_body", "rewrite_loops", "rewrite_pair",
           "live_eqns", "fresh_var", "unnamed", "jaxpr_flops"]


@dataclasses.dataclass(frozen=True)
class LoopPair:
    """A forward ``scan`` and the backward ``scan`` that reads its stacks.

    Attributes:
      forward, backward: equation indices in the flat jaxpr.
      positions: indices among the forward scan's outputs of the stacks only the
        backward scan reads (each a residual it may drop).
    """
    forward: int
    backward: int
    positions: tuple[int, ...]


def _scan_parts(eqn: core.JaxprEqn) -> tuple[int, int]:
    return eqn.params["num_consts"], eqn.params["num_carry"]


def find_loops(jaxpr: core.Jaxpr) -> list[LoopPair]:
    """The forward/backward scan pairs of a flat jaxpr, in program order. A stack
    is droppable when the backward scan, of the same length, reads it only among
    the arrays it scans over, and nothing else reads it."""
    users: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for k, v in enumerate(eqn.invars):
            if isinstance(v, core.Var):
                users.setdefault(v, []).append((i, k))
    returned = {v for v in jaxpr.outvars if isinstance(v, core.Var)}
    pairs = []
    for f, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive.name != "scan":
            continue
        by_backward: dict[int, list[int]] = {}
        for p in range(eqn.params["num_carry"], len(eqn.outvars)):
            v = eqn.outvars[p]
            if isinstance(v, core.DropVar) or v in returned or v not in users:
                continue
            readers = {b for b, _ in users[v]}
            if len(readers) != 1:
                continue
            b = readers.pop()
            other = jaxpr.eqns[b]
            if (other.primitive.name != "scan" or
                other.params["length"] != eqn.params["length"]):
                continue
            first_xs = sum(_scan_parts(other))
            if all(k >= first_xs for _, k in users[v]):
                by_backward.setdefault(b, []).append(p)
        if by_backward:
            b = max(by_backward, key=lambda b: len(by_backward[b]))
            pairs.append(LoopPair(f, b, tuple(by_backward[b])))
    return pairs


# ------------------------------------------------------------------ body graph

def jaxpr_flops(jaxpr: core.Jaxpr) -> float:
    """FLOPs of a (sub-)jaxpr by the op model, a loop body counted ``length``
    times (XLA's ``cost_analysis()`` counts a loop body once), a conditional by
    its costliest branch."""
    total = 0.0
    for eqn in jaxpr.eqns:
        total += _eqn_flops(eqn)
    return total


def _eqn_flops(eqn: core.JaxprEqn) -> float:
    subs = [p for p in eqn.params.values() if isinstance(p, (core.Jaxpr, core.ClosedJaxpr))]
    branches = eqn.params.get("branches")
    if branches:
        return max(jaxpr_flops(getattr(b, "jaxpr", b)) for b in branches)
    if subs:
        repeat = float(eqn.params.get("length", 1))
        return repeat * sum(jaxpr_flops(getattr(s, "jaxpr", s)) for s in subs)
    return primitive_cost(eqn)[0]


def _nbytes(aval) -> int:
    shape = getattr(aval, "shape", ())
    dtype = getattr(aval, "dtype", None)
    n = 1
    for d in shape:
        n *= int(d)
    return n * (dtype.itemsize if dtype is not None else 0)


@dataclasses.dataclass(frozen=True)
class BodyMap:
    """The planning view of one pair's forward body, and how to get back.

    Attributes:
      body: what :func:`remat.core.loops.loop_choices` plans on.
      vars: the body's var of each value id.
      residual_of: for each droppable output position, the value id it stacks.
    """
    body: LoopBody
    vars: tuple
    residual_of: dict


def loop_body(jaxpr: core.Jaxpr, pair: LoopPair) -> BodyMap:
    """The forward body of ``pair`` as a :class:`LoopBody`: one op per equation;
    inputs are the body's constants, then its arguments."""
    eqn = jaxpr.eqns[pair.forward]
    closed = eqn.params["jaxpr"]
    body = closed.jaxpr
    nc, ncarry = _scan_parts(eqn)
    b = GraphBuilder()
    ids: dict = {}
    for v in [*body.constvars, *body.invars]:
        ids[v] = b.add_input(_nbytes(v.aval), shape=v.aval.str_short())
    pinned = set()
    for i, e in enumerate(body.eqns):
        ins = [ids[v] for v in e.invars if isinstance(v, core.Var)]
        outs = b.add_op(e.primitive.name, ins, [_nbytes(v.aval) for v in e.outvars],
                        output_shapes=[v.aval.str_short() for v in e.outvars],
                        flops=_eqn_flops(e), source=source_line(e))
        ids.update(zip(e.outvars, outs))
        if e.effects:
            pinned.add(i)
    # A residual may be rebuilt though the forward scan also returns it (the next
    # carry, or a stack of its own outputs): the backward scan then no longer
    # reads it, and that stack can go once its own readers have run, which in a
    # gradient are mostly in the forward pass (an RNN's states, read by the loss).
    residual_of = {p: ids[v] for p, v in enumerate(body.outvars)
                   if p in pair.positions and isinstance(v, core.Var)}
    graph: Graph = b.build([ids[v] for v in body.outvars if isinstance(v, core.Var)])
    residuals = tuple(dict.fromkeys(residual_of.values()))
    carries = tuple(ids[v] for v in body.invars[nc:nc + ncarry])
    variables = [None] * len(graph.values)
    for v, i in ids.items():
        variables[i] = v
    return BodyMap(LoopBody(graph, int(eqn.params["length"]), residuals, carries,
                            frozenset(pinned)), tuple(variables), residual_of)


# --------------------------------------------------------------------- rewrite

def rewrite_loops(jaxpr: core.Jaxpr, pairs: Sequence[LoopPair],
                  maps: Sequence[BodyMap], choices: Sequence[LoopChoice]) -> core.Jaxpr:
    """``jaxpr`` with each pair's stacks rebuilt as its choice says."""
    eqns = list(jaxpr.eqns)
    for pair, bmap, choice in zip(pairs, maps, choices):
        if choice.rebuilt:
            eqns[pair.forward], eqns[pair.backward] = rewrite_pair(
                eqns[pair.forward], eqns[pair.backward], pair, bmap, choice)
    return jaxpr.replace(eqns=eqns)


def fresh_var(v):
    """A new var of ``v``'s type (a var belongs to one jaxpr)."""
    return core.Var(v.aval)


def unnamed(d):
    """``d`` without argument and result names (a rewritten body's differ)."""
    return core.DebugInfo(d.traced_for, d.func_src_info, None, None)


def live_eqns(body: core.Jaxpr, outvars) -> list:
    """The equations of ``body`` that ``outvars`` need, and effectful ones."""
    needed = {v for v in outvars if isinstance(v, core.Var)}
    keep = []
    for e in reversed(body.eqns):
        if e.effects or any(v in needed for v in e.outvars):
            keep.append(e)
            needed.update(v for v in e.invars if isinstance(v, core.Var))
    return keep[::-1]


def rewrite_pair(fwd: core.JaxprEqn, bwd: core.JaxprEqn, pair: LoopPair,
                  bmap: BodyMap, choice: LoopChoice):
    """The two equations of ``pair`` with ``choice`` applied."""
    length = bmap.body.length
    rebuilt = set(choice.rebuilt)
    dropped = [p for p, r in bmap.residual_of.items() if r in rebuilt]
    fclosed = fwd.params["jaxpr"]
    fbody = fclosed.jaxpr
    fnc, fncarry = _scan_parts(fwd)
    # Forward: drop the rebuilt stacks, stack the carries the rebuild needs.
    carry_vars = [bmap.vars[c] for c in choice.carries]
    f_outvars = [v for p, v in enumerate(fbody.outvars) if p not in dropped] + carry_vars
    new_fbody = fbody.replace(outvars=f_outvars, eqns=live_eqns(fbody, f_outvars),
                              debug_info=unnamed(fbody.debug_info))
    carry_stacks = [core.Var(core.unmapped_aval(length, 0, v.aval)) for v in carry_vars]
    f_out = [v for p, v in enumerate(fwd.outvars) if p not in dropped] + carry_stacks
    new_fwd = fwd.replace(outvars=f_out, params=dict(
        fwd.params, jaxpr=core.ClosedJaxpr(new_fbody, fclosed.consts)))

    # Backward: take what the rebuild reads; rebuild first, then the old body.
    bclosed = bwd.params["jaxpr"]
    bbody = bclosed.jaxpr
    bnc, bncarry = _scan_parts(bwd)
    recompute = [fbody.eqns[o] for o in choice.recompute]
    reads = set()
    for e in recompute:
        reads.update(v for v in e.invars if isinstance(v, core.Var))
    reads.update(bmap.vars[r] for r in choice.rebuilt)
    env: dict = {}         # forward body var -> backward body var
    for p, v in enumerate(fbody.outvars):     # kept residuals: their slices
        if p in pair.positions and p not in dropped and isinstance(v, core.Var):
            for k, outer in enumerate(bwd.invars):
                if outer is fwd.outvars[p] and k >= bnc + bncarry:
                    env.setdefault(v, bbody.invars[k])
    new_constvars, new_consts = [], []
    for cv, c in zip(fbody.constvars, fclosed.consts):
        if cv in reads and cv not in env:
            env[cv] = fresh_var(cv)
            new_constvars.append(env[cv])
            new_consts.append(c)
    extra_consts, extra_consts_in = [], []
    for v, outer in zip(fbody.invars[:fnc], fwd.invars[:fnc]):
        if v in reads and v not in env:
            env[v] = fresh_var(v)
            extra_consts.append(env[v])
            extra_consts_in.append(outer)
    extra_xs, extra_xs_in = [], []
    for v, outer in zip(fbody.invars[fnc + fncarry:], fwd.invars[fnc + fncarry:]):
        if v in reads and v not in env:
            env[v] = fresh_var(v)
            extra_xs.append(env[v])
            extra_xs_in.append(outer)
    for v, stack in zip(carry_vars, carry_stacks):
        env[v] = fresh_var(v)
        extra_xs.append(env[v])
        extra_xs_in.append(stack)
    body_eqns = []
    for e in recompute:
        outs = [fresh_var(v) for v in e.outvars]
        body_eqns.append(e.replace(invars=[env.get(v, v) if isinstance(v, core.Var)
                                           else v for v in e.invars], outvars=outs))
        env.update(zip(e.outvars, outs))
    # The backward body's slices of dropped stacks become the rebuilt values.
    subst = {}
    keep_xs = []
    for k in range(bnc + bncarry, len(bwd.invars)):
        outer = bwd.invars[k]
        hit = [p for p in dropped if fwd.outvars[p] is outer]
        if hit:
            subst[bbody.invars[k]] = env[fbody.outvars[hit[0]]]
        else:
            keep_xs.append(k)
    sub = lambda v: subst.get(v, v) if isinstance(v, core.Var) else v
    for e in bbody.eqns:
        body_eqns.append(e.replace(invars=[sub(v) for v in e.invars]))
    return new_fwd, backward_with(
        bwd, body_eqns, [sub(v) for v in bbody.outvars], keep_xs,
        closure=(new_constvars, new_consts), consts=(extra_consts, extra_consts_in),
        xs=(extra_xs, extra_xs_in))


def backward_with(bwd: core.JaxprEqn, eqns: list, outvars: list, keep: list[int], *,
                  closure: tuple[list, list], consts: tuple[list, list],
                  xs: tuple[list, list]) -> core.JaxprEqn:
    """The backward scan ``bwd`` running ``eqns`` (returning ``outvars``) as its
    body. Its operands: ``consts`` (body vars, outer operands) first, then its own
    consts and carries, its scanned operands at positions ``keep``, and ``xs``
    (body vars, outer operands) last; ``closure`` (body vars, values) joins the
    body's closed-over constants. New operands are never linear."""
    bclosed = bwd.params["jaxpr"]
    bbody = bclosed.jaxpr
    bnc, bncarry = _scan_parts(bwd)
    (const_vars, const_in), (xs_vars, xs_in) = consts, xs
    invars = (const_vars + bbody.invars[:bnc + bncarry] +
              [bbody.invars[k] for k in keep] + xs_vars)
    body = core.Jaxpr([*bbody.constvars, *closure[0]], invars, outvars, eqns,
                      effects=core.join_effects(*(e.effects for e in eqns)),
                      debug_info=unnamed(bbody.debug_info))
    params = dict(bwd.params, num_consts=bnc + len(const_vars),
                  jaxpr=core.ClosedJaxpr(body, [*bclosed.consts, *closure[1]]))
    if "linear" in params:
        linear = list(params["linear"])
        params["linear"] = tuple([False] * len(const_vars) + linear[:bnc + bncarry] +
                                 [linear[k] for k in keep] + [False] * len(xs_vars))
    operands = (const_in + bwd.invars[:bnc + bncarry] + [bwd.invars[k] for k in keep] +
                xs_in)
    return bwd.replace(invars=operands, params=params)

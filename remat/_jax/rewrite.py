"""Plan -> jaxpr: emit a rewritten program whose recomputations the compiler keeps.

The input is a flat jaxpr (``inline.py``: one equation per op of the planning
graph, op ``i`` being equation ``i``) and a :class:`remat.core.plan.Rewritten`
schedule. Ops outside regions are emitted as they were. Each region's block becomes
one ``remat_p`` equation (``differentiated=True``, so it is lowered as an opaque
region, gated on its late inputs on CPU) whose body runs the copies and then the consumers; it
takes every value the block reads from outside (those the copies read first, then
the ones only the consumers read: ``num_late``, the late inputs the lowering may
gate on) and returns every value the block defines that is read after it. The
regions are chained in the plan's order (``_after``): each returns a flag the next
one reads, so the compiler runs them in the order the plan was simulated in.
"""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

from remat._jax.compat import core, region_debug_info
from remat._jax.primitive import remat_p
from remat.core.plan import Rewritten


def rewrite_jaxpr(jaxpr: core.Jaxpr, plan: Rewritten, lowering: str | None = None,
                  placed: dict | None = None) -> core.Jaxpr:
    """The program of ``plan``, built from the equations of ``jaxpr``; its regions
    lowered with ``lowering`` (None: the platform's default, see ``lowering.py``),
    their results placed by ``placed`` (a var's sharding, on several devices:
    ``sharding.value_shardings``)."""
    eqns = jaxpr.eqns
    block_start = {block[0]: k for k, block in enumerate(plan.blocks) if block}
    last_read = _last_reads(jaxpr, plan)
    new_eqns = []
    step = 0
    done = None          # the previous region's "ran" flag (see _after)
    while step < len(plan.schedule):
        op = plan.schedule[step]
        if plan.region[op] < 0:
            new_eqns.append(eqns[plan.origin[op]])
            step += 1
            continue
        block = plan.blocks[block_start[op]]
        eqn = _region_eqn(
            [eqns[plan.origin[o]] for o in block], [plan.is_copy[o] for o in block],
            last_read, step + len(block) - 1, lowering, placed or {})
        eqn, done = _after(eqn, done)
        new_eqns.append(eqn)
        step += len(block)
    return jaxpr.replace(eqns=new_eqns)


_F32 = np.dtype("float32")


def _after(eqn: core.JaxprEqn, done: core.Var | None
           ) -> tuple[core.JaxprEqn, core.Var]:
    """``eqn`` (a region) made to run after the region whose *ran* flag is
    ``done``, and its own flag.

    Each region returns one more value, the scalar 1.0, its ran flag: where the
    region is a conditional (the CPU lowering) the taken branch returns it, a
    value no pass can fold. The next region reads the previous one's flag: its
    smallest early input ``x`` enters the body as ``select(ran == 1, x, 0)``, the
    same bits at run time. So the regions run in the order the planner simulated;
    left free, XLA:CPU's depth-first scheduler runs a region whose result is needed
    only at the end (a weight gradient) after all the others, and holds every value
    it reads meanwhile. Nothing is communicated: the flag is a constant of each
    device's own branch. Where a region is inlined (``"barrier"``, ``"gate"``), the
    flag is a constant and the select folds away: no order, no cost.
    """
    body = eqn.params["jaxpr"]
    num_early = len(eqn.invars) - eqn.params["num_late"]
    early = [v for v in body.invars[:num_early]          # numbers (not PRNG keys)
             if type(v.aval) is core.ShapedArray and v.aval.size > 0
             and not jax.dtypes.issubdtype(v.aval.dtype, jax.dtypes.extended)]
    eqns, invars, body_invars = list(body.eqns), list(eqn.invars), list(body.invars)
    if done is not None and early:
        x = min(early, key=lambda v: v.aval.size * v.aval.dtype.itemsize)
        flag, which = core.Var(done.aval), core.Var(core.ShapedArray((), np.bool_))
        zeros, gated = core.Var(x.aval), core.Var(x.aval)
        scalar = core.ShapedArray((), x.aval.dtype)
        eqns = [_new(lax.eq_p, [flag, core.Literal(np.float32(1), done.aval)], [which],
                     {}),
                _new(lax.broadcast_in_dim_p, [core.Literal(np.zeros((), x.aval.dtype),
                                                           scalar)], [zeros],
                     dict(shape=x.aval.shape, broadcast_dimensions=(), sharding=None)),
                _new(lax.select_n_p, [which, zeros, x], [gated], {}),
                *(e.replace(invars=[gated if v is x else v for v in e.invars])
                  for e in eqns)]
        invars.insert(num_early, done)
        body_invars.insert(num_early, flag)
    ran = core.Var(core.ShapedArray((), _F32))
    outvars = [*body.outvars, core.Literal(np.float32(1), core.ShapedArray((), _F32))]
    new_body = body.replace(invars=body_invars, outvars=outvars, eqns=eqns)
    params = dict(eqn.params, jaxpr=new_body)
    if "out_shardings" in params:
        params["out_shardings"] = (*params["out_shardings"], None)
    return eqn.replace(invars=invars, outvars=[*eqn.outvars, ran], params=params), ran


def _new(prim, invars, outvars, params) -> core.JaxprEqn:
    return core.new_jaxpr_eqn(invars, outvars, prim, params, core.no_effects)


def _last_reads(jaxpr: core.Jaxpr, plan: Rewritten) -> dict:
    """For each original var, the last step that reads it (copies read their
    originals' inputs, so they count as reads of those); returned vars are read
    after every step."""
    last: dict = {}
    for step, op in enumerate(plan.schedule):
        for v in jaxpr.eqns[plan.origin[op]].invars:
            if isinstance(v, core.Var):
                last[v] = step
    for v in jaxpr.outvars:
        if isinstance(v, core.Var):
            last[v] = len(plan.schedule)
    return last


def _region_eqn(block_eqns, copies, last_read: dict, end: int,
                lowering: str | None, placed: dict) -> core.JaxprEqn:
    """One ``remat_p`` equation running ``block_eqns`` (copies first), the last
    of them at step ``end``; its results annotated with their shardings in
    ``placed``, if any."""
    rename: dict = {}        # outer var -> var inside the body
    inputs: list = []        # outer vars the body reads, in first-use order
    body_eqns = []
    outputs: list = []       # outer vars defined in the block and read after it

    def inner(v):
        if not isinstance(v, core.Var):
            return v             # a literal
        if v not in rename:
            rename[v] = core.Var(v.aval)
            inputs.append(v)
        return rename[v]

    copy_of: dict = {}       # original outvar -> its recomputed var inside the body
    num_early = None         # inputs the copies read (the copies come first)
    for eqn, is_copy in zip(block_eqns, copies):
        if not is_copy and num_early is None:
            num_early = len(inputs)
        invars = [copy_of[v] if isinstance(v, core.Var) and v in copy_of else inner(v)
                  for v in eqn.invars]
        outvars = [core.Var(v.aval) for v in eqn.outvars]
        body_eqns.append(eqn.replace(invars=invars, outvars=outvars))
        for old, new in zip(eqn.outvars, outvars):
            if is_copy:
                copy_of[old] = new
            else:
                rename[old] = new
                if last_read.get(old, -1) > end:
                    outputs.append(old)
    body = core.Jaxpr([], [rename[v] for v in inputs], [rename[v] for v in outputs],
                      body_eqns,
                      effects=core.join_effects(*(e.effects for e in body_eqns)),
                      debug_info=region_debug_info())
    params = dict(jaxpr=body, prevent_cse=True, differentiated=True, policy=None,
                  lowering=lowering, num_late=len(inputs) - (num_early or 0))
    out_shardings = tuple(placed.get(v) for v in outputs)
    if any(out_shardings):
        params["out_shardings"] = out_shardings
    return core.new_jaxpr_eqn(list(inputs), list(outputs), remat_p, params,
                              body.effects, block_eqns[-1].source_info)

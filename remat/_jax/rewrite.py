"""Plan -> jaxpr: emit a rewritten program whose recomputations the compiler keeps.

The input is a flat jaxpr (``inline.py``: one equation per op of the planning
graph, op ``i`` being equation ``i``) and a :class:`remat.core.plan.Rewritten`
schedule. Ops outside regions are emitted as they were. Each region's block becomes
one ``remat_p`` equation (``differentiated=True``, so it is lowered as an opaque
region, gated on its late inputs on CPU) whose body runs the copies and then the consumers; it
takes every value the block reads from outside (those the copies read first, then
the ones only the consumers read: ``num_late``, the late inputs the lowering may
gate on) and returns every value the block defines that is read after it.
"""

from __future__ import annotations

from remat._jax.compat import core, region_debug_info
from remat._jax.primitive import remat_p
from remat.core.plan import Rewritten


def rewrite_jaxpr(jaxpr: core.Jaxpr, plan: Rewritten, lowering: str | None = None
                  ) -> core.Jaxpr:
    """The program of ``plan``, built from the equations of ``jaxpr``; its regions
    lowered with ``lowering`` (None: the platform's default, see ``lowering.py``)."""
    eqns = jaxpr.eqns
    block_start = {block[0]: k for k, block in enumerate(plan.blocks) if block}
    last_read = _last_reads(jaxpr, plan)
    new_eqns = []
    step = 0
    while step < len(plan.schedule):
        op = plan.schedule[step]
        if plan.region[op] < 0:
            new_eqns.append(eqns[plan.origin[op]])
            step += 1
            continue
        block = plan.blocks[block_start[op]]
        new_eqns.append(_region_eqn(
            [eqns[plan.origin[o]] for o in block], [plan.is_copy[o] for o in block],
            last_read, step + len(block) - 1, lowering))
        step += len(block)
    return jaxpr.replace(eqns=new_eqns)


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
                lowering: str | None) -> core.JaxprEqn:
    """One ``remat_p`` equation running ``block_eqns`` (copies first), the last
    of them at step ``end``."""
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
    return core.new_jaxpr_eqn(
        list(inputs), list(outputs), remat_p,
        dict(jaxpr=body, prevent_cse=True, differentiated=True, policy=None,
             lowering=lowering, num_late=len(inputs) - (num_early or 0)),
        body.effects, block_eqns[-1].source_info)

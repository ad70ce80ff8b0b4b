"""Flatten a program for the automatic pass: inline calls, merge repeats, drop dead code.

The compiler inlines ``jit`` calls, ``closed_call``, custom-derivative calls (whose
derivative rules have already run by the time a gradient is traced) and checkpoint
regions, so the automatic pass sees through them too and plans on one flat list of
equations. A ``cond`` whose branch index is a constant (JAX folds a predicate it
can decide, as optax.MultiSteps' skip test, into a literal; a scalar equation
of constants, as ``lax.switch``'s clamp of a constant index, is folded here) is
its branch: XLA inlines it too. Other control flow (``scan``, ``while``,
``cond``) stays as one equation.

Inside a checkpoint region, repeated computations are merged: an equation with
the same primitive, operands and parameters as an earlier one (and no effects) is
the earlier one. So a region the user wrote, once inlined, leaves no second copy of
its forward pass: the flat program is the program without the user's checkpoints,
which the pass plans from (the program as written stays a candidate answer:
``planner.py``). Elsewhere equations are kept as written (XLA merges what repeats,
but a merged value lives from its first use to its last in the planner's model,
where XLA often fuses a cheap repeat, a broadcast or a transpose, into each use).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from remat._jax.compat import core, pe
from remat._jax.op_model import SHARDING_ANNOTATIONS

#: Checkpoint regions (``jax.checkpoint``'s and ``remat.checkpoint``'s).
REGIONS = frozenset({"remat2", "remat", "checkpoint"})
_INLINED = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
            "custom_vjp_call", "custom_vjp_call_jaxpr", *REGIONS}


def _body(eqn: core.JaxprEqn, invars: list | None = None
          ) -> tuple[core.Jaxpr, list[Any], list] | None:
    """The inlinable body of a call equation (``invars``: its operands as read,
    by default its own), the body's constants and its operands; or None."""
    invars = list(eqn.invars) if invars is None else invars
    if eqn.primitive.name == "cond" and isinstance(invars[0], core.Literal):
        branches = eqn.params["branches"]
        # out of range runs the last branch (XLA's case; lax.switch clamps first)
        index = min(max(int(np.asarray(invars[0].val)), 0), len(branches) - 1)
        return branches[index].jaxpr, list(branches[index].consts), invars[1:]
    if eqn.primitive.name not in _INLINED:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        body = eqn.params.get(key)
        if isinstance(body, core.ClosedJaxpr):
            body, consts = body.jaxpr, list(body.consts)
        elif isinstance(body, core.Jaxpr):
            consts = []
        else:
            continue
        if len(body.invars) == len(eqn.invars) and len(body.outvars) == len(eqn.outvars):
            return body, consts, invars
    return None


def inline_calls(closed: core.ClosedJaxpr) -> core.ClosedJaxpr:
    """``closed`` with call-like equations inlined (recursively), a checkpoint's
    repeats of earlier equations merged, and dead equations removed; its constants
    are the original ones followed by the inlined bodies'.

    >>> import jax, jax.numpy as jnp
    >>> f = jax.jit(lambda x: jnp.sin(x) * 2)
    >>> flat = inline_calls(jax.make_jaxpr(lambda x: f(f(x)))(1.0))
    >>> [e.primitive.name for e in flat.jaxpr.eqns]
    ['sin', 'mul', 'sin', 'mul']
    >>> g = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
    >>> flat = inline_calls(jax.make_jaxpr(jax.value_and_grad(g))(1.0))
    >>> [e.primitive.name for e in flat.jaxpr.eqns].count("sin")   # not 3: merged
    2
    """
    jaxpr = closed.jaxpr
    constvars, consts = list(jaxpr.constvars), list(closed.consts)
    eqns: list[core.JaxprEqn] = []
    env: dict = {}
    computed: dict = {}     # merge key -> the outputs of the first such equation

    def read(v):
        return env.get(v, v) if isinstance(v, core.Var) else v

    def emit(eqn_list, local: dict, in_region: bool):
        def rd(v):
            if not isinstance(v, core.Var):
                return v
            return local[v] if v in local else read(v)

        for eqn in eqn_list:
            invars = [rd(v) for v in eqn.invars]
            folded = _folded(eqn, invars)
            if folded is not None:
                local.update(zip(eqn.outvars, folded))
                continue
            found = _body(eqn, invars)
            if found is None:
                key = _merge_key(eqn, invars)
                earlier = computed.get(key) if key is not None and in_region else None
                if earlier is not None and all(
                        isinstance(new, core.DropVar) or not isinstance(old, core.DropVar)
                        for old, new in zip(earlier, eqn.outvars)):
                    for old, new in zip(eqn.outvars, earlier):
                        local[old] = new
                    continue
                outvars = [v if isinstance(v, core.DropVar) else core.Var(v.aval)
                           for v in eqn.outvars]
                if key is not None:
                    computed.setdefault(key, outvars)
                eqns.append(eqn.replace(invars=invars, outvars=outvars))
                for old, new in zip(eqn.outvars, outvars):
                    local[old] = new
                continue
            body, body_consts, invars = found
            inner: dict = {}
            for cv, c in zip(body.constvars, body_consts):
                fresh = core.Var(cv.aval)
                constvars.append(fresh)
                consts.append(c)
                inner[cv] = fresh
            for iv, outer in zip(body.invars, invars):
                inner[iv] = outer
            emit(body.eqns, inner, in_region or eqn.primitive.name in REGIONS)
            for old, res in zip(eqn.outvars, body.outvars):
                local[old] = inner.get(res, res) if isinstance(res, core.Var) else res

    top: dict = {}
    emit(jaxpr.eqns, top, False)
    outvars = [top.get(v, v) if isinstance(v, core.Var) else v for v in jaxpr.outvars]
    flat = core.Jaxpr(constvars, jaxpr.invars, outvars, eqns,
                      effects=core.join_effects(*(e.effects for e in eqns)),
                      debug_info=jaxpr.debug_info)
    flat, _ = pe.dce_jaxpr(flat, [True] * len(outvars), instantiate=True)
    return core.ClosedJaxpr(flat, consts)


def _folded(eqn: core.JaxprEqn, invars: list) -> list | None:
    """The results of an integer or boolean scalar equation of constants, as
    literals (as XLA folds it: a ``lax.switch`` on a constant index clamps it
    first), or None. Only what a conditional's index is made of: folding runs the
    equation eagerly, which compiles it (tens of milliseconds on a first call),
    and XLA folds the rest itself (a mean's ``1 / n``). A sharding annotation of
    a scalar constant (a gradient's seed ``1.0`` under ``jax.jit``'s shardings)
    is that constant, whatever its type: kept, the planner would count it as
    communication in every region that reads it."""
    if (eqn.primitive.name in SHARDING_ANNOTATIONS and len(invars) == len(eqn.outvars) == 1
            and isinstance(invars[0], core.Literal) and eqn.outvars[0].aval.shape == ()):
        return [core.Literal(invars[0].val, eqn.outvars[0].aval)]
    if (not all(isinstance(v, core.Literal) for v in invars) or eqn.effects
            or not all(getattr(v.aval, "shape", None) == () and _is_index_dtype(v.aval)
                       for v in eqn.outvars)
            or eqn.primitive.name in _NEVER_MERGED or _has_body(eqn)):
        return None
    try:
        out = eqn.primitive.bind(*(np.asarray(v.val) for v in invars), **eqn.params)
        out = out if eqn.primitive.multiple_results else [out]
        return [core.Literal(np.asarray(o).astype(v.aval.dtype), v.aval)
                for o, v in zip(out, eqn.outvars)]
    except Exception:       # (nothing to fold it with, or a result no NumPy array
        return None         # holds, such as a PRNG key: left to the compiler)


def _is_index_dtype(aval) -> bool:
    """Whether ``aval`` holds integers or booleans (not a float, nor a key)."""
    dtype = getattr(aval, "dtype", None)
    try:
        return dtype is not None and np.dtype(dtype).kind in "biu"
    except TypeError:       # (an extended dtype: a typed PRNG key)
        return False


def _has_body(eqn: core.JaxprEqn) -> bool:
    """Whether ``eqn`` calls a jaxpr (a call, a loop, a conditional)."""
    bodies = (core.Jaxpr, core.ClosedJaxpr)
    return any(isinstance(p, bodies) or isinstance(p, (tuple, list)) and any(
        isinstance(q, bodies) for q in p) for p in eqn.params.values())


def has_regions(jaxpr: core.Jaxpr) -> bool:
    """Whether :func:`inline_calls` dissolves a checkpoint region of ``jaxpr``
    (at its top level or inside a call it inlines).

    >>> import jax, jax.numpy as jnp
    >>> has_regions(jax.make_jaxpr(jax.grad(jax.checkpoint(jnp.sin)))(1.0).jaxpr)
    True
    """
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in REGIONS:
            return True
        found = _body(eqn)
        if found is not None and has_regions(found[0]):
            return True
    return False


#: Primitives whose equal equations may give different results (stateful).
_NEVER_MERGED = frozenset({"rng_uniform"})


def _merge_key(eqn: core.JaxprEqn, invars: list) -> Any:
    """What makes two equations one computation (primitive, operands, parameters),
    or None for one never merged (effects, stateful, unhashable parameters)."""
    if eqn.effects or eqn.primitive.name in _NEVER_MERGED:
        return None
    operands = []
    try:
        for v in invars:
            if isinstance(v, core.Literal):     # (a typed key has no NumPy form)
                value = np.asarray(v.val)
                operands.append(("literal", value.dtype.str, value.shape,
                                 value.tobytes()))
            else:
                operands.append(v)
        key = (eqn.primitive, tuple(operands), tuple(sorted(eqn.params.items())))
        hash(key)
    except TypeError:
        return None
    return key

"""Mutable references (``jax.new_ref``) inside a checkpointed function.

Refs a function creates and uses internally are pure from the outside and need
nothing special. Refs it takes as arguments or closes over (external refs) raise a
question: when the function is recomputed for the backward pass, should its reads
see the ref's value from before the forward pass, and should its writes happen
again? Two answers, chosen with ``checkpoint(..., ref_effects=...)``:

- ``"once"`` (the default): effects on external refs happen once, in the forward
  pass. The region is made pure: it takes the values the refs held when the
  function was entered (saved as residuals like any input), works on fresh internal
  copies, and returns their final values, which are then written back to the refs
  outside the region. Gradients are those of the original program, whatever the
  ref's kind, and the recomputation cannot disturb the refs.

  A ref that reaches a ``jax.custom_vjp`` (anywhere inside, through ``jit``,
  ``scan``, ``cond`` or a nested checkpoint) is the exception: its backward rule
  may write to it, and that write must reach the caller's ref. Such a *backward
  ref* enters the region as itself, typed inside the region as kind
  ``"no_grad_no_remat"``, so JAX's partial evaluator keeps its forward reads and
  writes in the forward pass (a value read is saved, never re-read) while the
  backward rule receives the real ref and writes to it once.
- ``"replay"``: the refs themselves enter the region, so the recomputation reads
  their current values and repeats the writes (what ``jax.checkpoint`` does),
  except for refs of kind ``"no_grad_no_remat"``, whose accesses JAX's partial
  evaluator never recomputes. Writes made by backward rules land in the refs
  (once per backward pass) in this mode too.

The body is traced once either way; the rewrite works on its jaxpr.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from remat._jax import compat
from remat._jax.compat import (AbstractRef, AccumEffect, WriteEffect, core, effects,
                               pe, state_discharge, weakref_lru_cache)

REF_EFFECTS = ("once", "replay")

#: Primitives whose backward rule is user code that may write to a ref operand.
_BACKWARD_RULE_PRIMITIVES = frozenset({"custom_vjp_call", "custom_lin"})
#: The kind under which JAX's partial evaluator keeps a ref's accesses in the
#: forward pass (never recomputed).
_FORWARD_ONLY_KIND = "no_grad_no_remat"


class PureRegion(NamedTuple):
    """A region rewritten to take ref values: ``jaxpr(*consts, *args) -> (*outs,
    *final values of the refs in ref_positions)``."""
    jaxpr: core.Jaxpr
    consts: list[Any]
    ref_positions: tuple[int, ...]     # which original arguments were refs
                                       # taken by value (backward refs stay refs)
    written: tuple[bool, ...]          # per ref: may the region change it


def ref_positions(jaxpr: core.Jaxpr) -> tuple[int, ...]:
    return tuple(i for i, v in enumerate(jaxpr.invars)
                 if isinstance(v.aval, AbstractRef))


def ref_kinds(avals) -> tuple:
    """The kind of each ref among ``avals`` (None for other avals). JAX's ref
    avals compare equal whatever their kind, so a cache keyed on avals needs this
    beside them.

    >>> import jax
    >>> ref_kinds([jax.typeof(jax.new_ref(0.0, kind="no_grad_no_remat")),
    ...            jax.typeof(1.0)])
    ('no_grad_no_remat', None)
    """
    return tuple(getattr(a, "kind", None) if isinstance(a, AbstractRef) else None
                 for a in avals)


def _written_inputs(jaxpr: core.Jaxpr) -> set[int]:
    """Positions of the arguments the jaxpr writes to or accumulates into."""
    written = [e.input for e in jaxpr.effects
               if isinstance(e, (WriteEffect, AccumEffect))]
    # An effect names its input by position or, in a top-level jaxpr, by variable.
    return {e if isinstance(e, int) else jaxpr.invars.index(e) for e in written}


def has_internal_refs(jaxpr: core.Jaxpr) -> bool:
    return any(isinstance(e, core.InternalMutableArrayEffect) for e in jaxpr.effects)


def needs_purify(jaxpr: core.Jaxpr, ref_effects: str) -> bool:
    """Whether the region must be rewritten before it is bound: it has external
    refs to take by value, or internal refs (JAX's partial evaluator mishandles
    accumulation into those, so we turn them into values up front)."""
    return ((ref_effects == "once" and bool(ref_positions(jaxpr))) or
            has_internal_refs(jaxpr))


def backward_refs(jaxpr: core.Jaxpr) -> tuple[int, ...]:
    """Positions of the ref arguments that may reach a backward rule (a
    ``jax.custom_vjp``), directly or through any nested jaxpr.

    >>> import jax
    >>> @jax.custom_vjp
    ... def stash(ref, x):
    ...   return x
    >>> stash.defvjp(lambda r, x: (x, r), lambda r, g: (None, g))
    >>> closed = jax.make_jaxpr(lambda r, q, x: stash(r, x) + q[...])(
    ...     jax.new_ref(0.0), jax.new_ref(1.0), 2.0)
    >>> backward_refs(closed.jaxpr)
    (0,)
    """
    refs_in = {v for v in jaxpr.invars if isinstance(v.aval, AbstractRef)}
    reached = set()
    for eqn in jaxpr.eqns:
        operands = {v for v in eqn.invars if isinstance(v, core.Var) and v in refs_in}
        if operands and (eqn.primitive.name in _BACKWARD_RULE_PRIMITIVES or any(
                _has_backward_rule(sub) for sub in core.jaxprs_in_params(eqn.params))):
            reached |= operands
    return tuple(i for i, v in enumerate(jaxpr.invars) if v in reached)


def _has_backward_rule(jaxpr: core.Jaxpr) -> bool:
    """Whether ``jaxpr`` (or a jaxpr nested in it) calls a backward rule on a ref."""
    for eqn in jaxpr.eqns:
        if (eqn.primitive.name in _BACKWARD_RULE_PRIMITIVES and
                any(isinstance(v.aval, AbstractRef) for v in eqn.invars)):
            return True
        if any(_has_backward_rule(sub) for sub in core.jaxprs_in_params(eqn.params)):
            return True
    return False


def purify(jaxpr: core.Jaxpr, discharge_inputs: bool = True,
           keep_backward_refs: bool = True) -> PureRegion:
    """Rewrites ``jaxpr`` so that its internal refs, and its external ref arguments
    if ``discharge_inputs``, become values. With ``keep_backward_refs``, ref
    arguments that reach a backward rule stay refs, of the forward-only kind
    (see the module docstring); after differentiation (lowering) there are no
    backward rules left and every ref can be discharged.

    >>> import jax, jax.numpy as jnp
    >>> def f(x, r):
    ...   r[...] += x
    ...   return 2 * r[...]
    >>> closed = jax.make_jaxpr(f)(1.0, jax.new_ref(0.0))
    >>> purify(closed.jaxpr).ref_positions
    (1,)
    """
    return _purify(jaxpr, discharge_inputs, keep_backward_refs)


@weakref_lru_cache
def _purify(jaxpr: core.Jaxpr, discharge_inputs: bool,
            keep_backward_refs: bool) -> PureRegion:
    kept = backward_refs(jaxpr) if keep_backward_refs else ()
    positions = tuple(i for i in ref_positions(jaxpr) if i not in kept) \
        if discharge_inputs else ()
    written = _written_inputs(jaxpr)
    closed = pe.close_jaxpr(jaxpr)
    if discharge_inputs and kept:
        closed = _forward_only(closed, kept)
    should = [i in positions for i in range(len(jaxpr.invars))]
    # Before differentiation, lower=False keeps custom_vjp/custom_jvp calls: JAX's
    # default inlines them, dropping the user's derivative rules, as suits the
    # discharge at lowering time (after differentiation), where we keep it.
    pure = state_discharge.discharge_state(closed, should_discharge=should,
                                           lower=not keep_backward_refs)
    return PureRegion(pe.convert_constvars_jaxpr(pure.jaxpr), list(pure.consts),
                      positions, tuple(i in written for i in positions))


def _forward_only(closed: core.ClosedJaxpr, positions) -> core.ClosedJaxpr:
    """``closed`` with the refs at ``positions`` typed as the forward-only kind,
    in nested jaxprs too (JAX's ref avals carry the kind; its partial evaluator
    reads it from each operand's aval, level by level)."""
    avals = [_forward_only_aval(a) if i in positions else a
             for i, a in enumerate(closed.in_avals)]
    nested = _retype_nested(closed.jaxpr, {closed.jaxpr.invars[i] for i in positions})
    dbg = compat.unknown_debug_info(closed.jaxpr)
    jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(compat.lu.wrap_init(
        lambda *args: core.eval_jaxpr(nested, closed.consts, *args),
        debug_info=dbg), avals)
    return core.ClosedJaxpr(jaxpr, consts)


def _forward_only_aval(aval: AbstractRef) -> AbstractRef:
    return AbstractRef(aval.inner_aval, aval.memory_space, kind=_FORWARD_ONLY_KIND)


def _retype_nested(jaxpr: core.Jaxpr, targets: set) -> core.Jaxpr:
    """``jaxpr`` whose equations pass a variable of ``targets`` into a nested
    jaxpr get that nested jaxpr with the matching argument retyped (recursively).
    The variables of ``jaxpr`` itself are left alone."""
    eqns = []
    for eqn in jaxpr.eqns:
        hits = {j for j, v in enumerate(eqn.invars)
                if isinstance(v, core.Var) and v in targets}
        if hits and any(True for _ in core.jaxprs_in_params(eqn.params)):
            params = {k: _retype_param(eqn, k, val, hits) for k, val in eqn.params.items()}
            eqn = eqn.replace(params=params)
        eqns.append(eqn)
    return jaxpr.replace(eqns=eqns)


def _retype_param(eqn, key, value, hits):
    if isinstance(value, tuple):
        return tuple(_retype_param(eqn, key, v, hits) for v in value)
    if isinstance(value, core.ClosedJaxpr):
        return core.ClosedJaxpr(_retype_param(eqn, key, value.jaxpr, hits), value.consts)
    if not isinstance(value, core.Jaxpr):
        return value
    inner = _operand_to_argument(eqn, key, len(value.invars))
    positions = {inner[j] for j in hits if inner.get(j) is not None}
    return _retype_arguments(value, positions) if positions else value


def _operand_to_argument(eqn, key, num_args: int) -> dict[int, int]:
    """Which argument of the nested jaxpr ``eqn.params[key]`` each operand of
    ``eqn`` becomes: one to one (calls, ``scan``, ``remat``), after the index
    (``cond``), or split by constant counts (``while``)."""
    n = len(eqn.invars)
    if eqn.primitive.name == "while":
        nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        if key == "cond_jaxpr":
            return {j: (j if j < nc else j - nb) for j in range(n)
                    if j < nc or j >= nc + nb}
        return {j: j - nc for j in range(nc, n)}
    if num_args == n:
        return {j: j for j in range(n)}
    if num_args == n - 1:
        return {j: j - 1 for j in range(1, n)}
    return {}


def _retype_arguments(jaxpr: core.Jaxpr, positions: set[int]) -> core.Jaxpr:
    """``jaxpr`` with its ref arguments at ``positions`` given the forward-only
    kind: new variables, substituted in its equations and effects."""
    subst = {jaxpr.invars[i]: core.Var(_forward_only_aval(jaxpr.invars[i].aval))
             for i in positions if isinstance(jaxpr.invars[i].aval, AbstractRef)}
    if not subst:
        return jaxpr
    jaxpr = _retype_nested(jaxpr, set(subst))
    swap = lambda v: subst.get(v, v) if isinstance(v, core.Var) else v
    swap_effects = lambda effs: {
        e.replace(input_index=subst[e.input_index])
        if isinstance(getattr(e, "input_index", None), core.Var) and
        e.input_index in subst else e for e in effs}
    eqns = [e.replace(invars=[swap(v) for v in e.invars], effects=swap_effects(e.effects))
            for e in jaxpr.eqns]
    return jaxpr.replace(invars=[swap(v) for v in jaxpr.invars], eqns=eqns,
                         effects=swap_effects(jaxpr.effects))


def check_effects(jaxpr: core.Jaxpr) -> None:
    """Raises a clear error for effects a remat region cannot differentiate."""
    bad = effects.remat_allowed_effects.filter_not_in(jaxpr.effects)
    if bad:
        names = ", ".join(sorted(str(e) for e in bad))
        raise NotImplementedError(
            f"remat.checkpoint cannot differentiate a function with the effect(s) "
            f"{names}: recomputing it would repeat or reorder them. Move the "
            "effectful operation out of the checkpointed function.")
    if _forward_only_ref_in_while(jaxpr):
        raise NotImplementedError(
            "remat.checkpoint cannot differentiate a function that uses, inside a "
            "lax.while_loop, a ref whose accesses must stay in the forward pass (a "
            f"ref of kind {_FORWARD_ONLY_KIND!r}, or a ref the function hands to a "
            "jax.custom_vjp): JAX cannot split such a loop into a forward part and a "
            "recomputed part. Move the while_loop out of the checkpointed function, "
            "use lax.fori_loop with static bounds (a scan), or pass "
            "ref_effects='replay' to let the recomputation repeat the loop's accesses.")


def _forward_only_ref_in_while(jaxpr: core.Jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while" and any(
                isinstance(v.aval, AbstractRef) and v.aval.kind == _FORWARD_ONLY_KIND
                for v in eqn.invars):
            return True
        if any(_forward_only_ref_in_while(sub)
               for sub in core.jaxprs_in_params(eqn.params)):
            return True
    return False


def read(ref) -> Any:
    """The current value of a ref (or of a traced ref)."""
    return ref[...]


def write(ref, value) -> None:
    ref[...] = value

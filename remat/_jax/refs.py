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
- ``"replay"``: the refs themselves enter the region, so the recomputation reads
  their current values and repeats the writes (what ``jax.checkpoint`` does),
  except for refs of kind ``"no_grad_no_remat"``, whose accesses JAX's partial
  evaluator never recomputes.

The body is traced once either way; the rewrite works on its jaxpr.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from remat._jax.compat import (AbstractRef, AccumEffect, WriteEffect, core, effects,
                               pe, state_discharge, weakref_lru_cache)

REF_EFFECTS = ("once", "replay")


class PureRegion(NamedTuple):
    """A region rewritten to take ref values: ``jaxpr(*consts, *args) -> (*outs,
    *final values of the refs in ref_positions)``."""
    jaxpr: core.Jaxpr
    consts: list[Any]
    ref_positions: tuple[int, ...]     # which original arguments were refs
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


def purify(jaxpr: core.Jaxpr, discharge_inputs: bool = True) -> PureRegion:
    """Rewrites ``jaxpr`` so that its internal refs, and its external ref arguments
    if ``discharge_inputs``, become values.

    >>> import jax, jax.numpy as jnp
    >>> def f(x, r):
    ...   r[...] += x
    ...   return 2 * r[...]
    >>> closed = jax.make_jaxpr(f)(1.0, jax.new_ref(0.0))
    >>> purify(closed.jaxpr).ref_positions
    (1,)
    """
    return _purify(jaxpr, discharge_inputs)


@weakref_lru_cache
def _purify(jaxpr: core.Jaxpr, discharge_inputs: bool) -> PureRegion:
    positions = ref_positions(jaxpr) if discharge_inputs else ()
    written = _written_inputs(jaxpr)
    should = [i in positions for i in range(len(jaxpr.invars))]
    pure = state_discharge.discharge_state(pe.close_jaxpr(jaxpr),
                                           should_discharge=should)
    return PureRegion(pe.convert_constvars_jaxpr(pure.jaxpr), list(pure.consts),
                      positions, tuple(i in written for i in positions))


def check_effects(jaxpr: core.Jaxpr) -> None:
    """Raises a clear error for effects a remat region cannot differentiate."""
    bad = effects.remat_allowed_effects.filter_not_in(jaxpr.effects)
    if bad:
        names = ", ".join(sorted(str(e) for e in bad))
        raise NotImplementedError(
            f"remat.checkpoint cannot differentiate a function with the effect(s) "
            f"{names}: recomputing it would repeat or reorder them. Move the "
            "effectful operation out of the checkpointed function.")


def read(ref) -> Any:
    """The current value of a ref (or of a traced ref)."""
    return ref[...]


def write(ref, value) -> None:
    ref[...] = value

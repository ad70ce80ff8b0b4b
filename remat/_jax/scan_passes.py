"""Whether a loop already keeps a region's forward pass and recomputation apart.

When ``jax.grad`` (or ``jax.vjp``, ``jax.linearize``) goes through a ``lax.scan``,
the scan's body is split: what runs now goes into a forward loop, what runs later
(the recomputation, then its transposed backward) into a second loop. Two loops
are two separate computations in the compiled program, so XLA can neither merge
the recomputation with the forward values (CSE works inside one computation) nor
schedule it early (it runs in a different loop, after the forward one ends). Such
a region needs no protection: JAX's own ``jax.checkpoint`` documents
``prevent_cse=False`` as safe in a scan body, and a protection there only costs
memory (the gate's copies, the conditional's zero branch).

This module wraps the three rules by which JAX splits a scan (tracer-level partial
evaluation, jaxpr-level partial evaluation and direct linearization) so that,
while one runs on a scan that stays a loop, :func:`passes_separated` is True;
``primitive.py`` then gives the regions it splits there ``prevent_cse=False``.

A scan stays a loop when it runs its body in a ``while`` at least twice and
leaves no iterations outside it: ``unroll`` divides ``length`` and ``length //
unroll >= 2``. A fully unrolled scan (``unroll=True``, or ``unroll == length``)
is straight-line code in the surrounding computation, and so are the remainder
iterations of a partly unrolled one; a loop of one trip is removed by XLA. In
those cases the forward and the recomputation can meet, and the flag stays as the
surrounding loop (if any) set it.

>>> loop_separates(dict(length=8, unroll=1)), loop_separates(dict(length=8, unroll=8))
(True, False)
"""

from __future__ import annotations

import contextlib
import contextvars

from jax.extend.core.primitives import scan_p

from remat._jax.compat import ad, pe

_separated = contextvars.ContextVar("remat_loop_separates_passes", default=False)


def passes_separated() -> bool:
    """True while JAX splits the body of a scan that stays a loop (see module)."""
    return _separated.get()


def loop_separates(params: dict) -> bool:
    """Whether a scan with these parameters compiles to a loop of two or more trips
    holding every iteration."""
    length, unroll = params["length"], int(params["unroll"])
    return unroll >= 1 and length % unroll == 0 and length // unroll >= 2


@contextlib.contextmanager
def _inside(params: dict):
    token = _separated.set(_separated.get() or loop_separates(params))
    try:
        yield
    finally:
        _separated.reset(token)


def _wrap_tracer_rule(rule):
    def split_scan(trace, *tracers, **params):
        with _inside(params):
            return rule(trace, *tracers, **params)
    split_scan.__wrapped__ = rule
    return split_scan


def _wrap_jaxpr_rule(rule):
    def split_scan(saveable, unks_in, inst_in, eqn):
        with _inside(eqn.params):
            return rule(saveable, unks_in, inst_in, eqn)
    split_scan.__wrapped__ = rule
    return split_scan


def _wrap_linearize_rule(rule):
    def linearize_scan(is_vjp, nonzeros, *primals, **params):
        with _inside(params):
            return rule(is_vjp, nonzeros, *primals, **params)
    linearize_scan.__wrapped__ = rule
    return linearize_scan


def _register() -> None:
    for table, wrap in ((pe.custom_partial_eval_rules, _wrap_tracer_rule),
                        (pe.partial_eval_jaxpr_custom_rules, _wrap_jaxpr_rule),
                        (ad.primitive_linearizations, _wrap_linearize_rule)):
        rule = table.get(scan_p)
        if rule is not None and not hasattr(rule, "__wrapped__"):
            table[scan_p] = wrap(rule)

_register()

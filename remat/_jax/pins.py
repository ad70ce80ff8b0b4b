"""Late reads: a backward convolution reads its saved operand where it runs.

A convolution of the backward pass reads a value the forward pass made (the
weight gradient's activation, the input gradient's weights) together with one
the backward pass made (a cotangent). XLA:CPU lays such an operand out anew for
the convolution (a transposed copy) and, as the copy depends on the saved value
alone, may compute it as soon as the value exists, in the forward pass, and hold
it until the backward convolution runs: saved activations are then held twice
across the forward pass's peak, in bytes no model of the program sees.

:func:`pin_late_reads` makes each such read late. A convolution whose one
operand depends on the other (``conv(x, g)`` where ``g`` is computed from ``x``)
becomes a ``remat_p`` region with nothing to recompute, its early operand
protected and the other one late, lowered as ``"gate"`` (``lowering.py``): the
early operand enters as ``select(gate == 0, x, 0)`` with ``gate`` read from the
late one, the same bits, that exist only once the late operand does. The layout
copy then runs next to the convolution that reads it. Nothing is recomputed; the
select is fused into the copy. The planner applies it where the platform's
default lowering gates regions (XLA:CPU), to the plain program and every plan.

>>> import jax, jax.numpy as jnp
>>> def loss(w, x):
...     y = jax.lax.conv(x, w, (1, 1), "SAME")
...     return jnp.sum(jax.lax.conv(y, w, (1, 1), "SAME") ** 2)
>>> closed = jax.make_jaxpr(jax.grad(loss))(jnp.ones((4, 4, 3, 3)),
...                                         jnp.ones((2, 4, 8, 8)))
>>> pinned = pin_late_reads(closed.jaxpr)
>>> # the two weight gradients' convolutions, and the second forward one (whose
>>> # input is computed from w)
>>> sum(e.primitive.name == "remat" for e in pinned.eqns)
3
>>> no_conv = jax.make_jaxpr(jnp.sin)(1.0).jaxpr
>>> pin_late_reads(no_conv) is no_conv
True
"""

from __future__ import annotations

from remat._jax.compat import core, region_debug_info
from remat._jax.lowering import gate_can_read
from remat._jax.primitive import remat_p

#: Primitives whose late reads are pinned: convolutions, whose operands XLA:CPU
#: copies into the layout its kernels take, a copy the gate's select fuses into.
#: Matrix products are left as written: XLA:CPU fuses no select into their
#: operands, so each gated operand would be a copy and a kernel of its own.
PINNED_PRIMITIVES = frozenset({"conv_general_dilated"})


def pin_late_reads(jaxpr: core.Jaxpr) -> core.Jaxpr:
    """``jaxpr`` with each top-level convolution that reads an operand the other
    depends on rewritten to read it late (see the module docstring); the same
    object where there is none."""
    operands = {v for e in jaxpr.eqns if e.primitive.name in PINNED_PRIMITIVES
                for v in e.invars if isinstance(v, core.Var)}
    if not operands:
        return jaxpr
    bit = {v: 1 << i for i, v in enumerate(operands)}
    depends: dict = {}    # var -> bits of the operands it is computed from (itself too)
    eqns, changed = [], False
    for eqn in jaxpr.eqns:
        reads = 0
        for v in eqn.invars:
            if isinstance(v, core.Var):
                reads |= depends.get(v, 0) | bit.get(v, 0)
        for v in eqn.outvars:
            depends[v] = reads
        pinned = eqn.primitive.name in PINNED_PRIMITIVES and _pinned(eqn, depends, bit)
        eqns.append(pinned or eqn)
        changed |= bool(pinned)
    return jaxpr.replace(eqns=eqns) if changed else jaxpr


def _pinned(eqn: core.JaxprEqn, depends: dict, bit: dict) -> core.JaxprEqn | None:
    """``eqn`` as a region that reads its early operands late, or None if no
    operand is early (computed before, and read by what computes, another)."""
    vars_ = [v for v in eqn.invars if isinstance(v, core.Var)]
    early = [v for v in vars_
             if any(bit[v] & (depends.get(u, 0) | bit.get(u, 0)) for u in vars_ if u is not v)]
    late = [v for v in vars_ if v not in early]
    if not early or not late or not all(gate_can_read(v.aval) for v in late):
        return None
    inputs = [*early, *late]
    inner = {v: core.Var(v.aval) for v in inputs}
    outvars = [core.Var(v.aval) for v in eqn.outvars]
    body_eqn = eqn.replace(invars=[inner.get(v, v) if isinstance(v, core.Var) else v
                                   for v in eqn.invars], outvars=outvars)
    body = core.Jaxpr([], [inner[v] for v in inputs], outvars, [body_eqn],
                      effects=eqn.effects, debug_info=region_debug_info())
    return core.new_jaxpr_eqn(
        inputs, list(eqn.outvars), remat_p,
        dict(jaxpr=body, prevent_cse=(True,) * len(early) + (False,) * len(late),
             differentiated=True, policy=None, lowering="gate", num_late=len(late)),
        eqn.effects, eqn.source_info)


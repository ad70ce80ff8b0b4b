"""What XLA does with each JAX primitive: how it fuses, what it costs.

The jaxpr adapter (``to_graph``) asks this module, per equation, for the fusion kind
of the op (see ``remat.core.fusion``) and its FLOP and transcendental estimates.
Tables are by primitive name, as of jax 0.10.2; a primitive missing from them is
treated as an unfusible op costing one FLOP per output element.
"""

from __future__ import annotations

import math
from typing import Any

from ..core.algorithms.recomputable import NOT_RECOMPUTABLE
from .compat_graph import JaxprEqn

__all__ = ["fusion_kind", "primitive_cost", "elements", "is_half_float",
           "is_half_precision_matmul", "communicates", "repeatable", "COLLECTIVES",
           "SHARDING_ANNOTATIONS",
           "COMMUNICATION_FLOPS_PER_BYTE"]

#: Ops that move data between devices.
COLLECTIVES = frozenset({
    "psum", "psum_invariant", "pmax", "pmin", "all_gather", "all_gather_invariant",
    "all_gather_reduced", "reduce_scatter", "psum_scatter", "all_to_all",
    "ragged_all_to_all", "ppermute", "pbroadcast", "psend", "precv", "preduced",
    "unreduced_psum", "unreduced_reduce_scatter", "all_reduce",
})

#: Sharding annotations, which XLA turns into whatever resharding (all-gather,
#: all-to-all ...) they need in a partitioned program, and into nothing on one device.
SHARDING_ANNOTATIONS = frozenset({"sharding_constraint", "reshard", "device_put"})

_TRANSCENDENTAL = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan",
    "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "pow",
    "sqrt", "rsqrt", "cbrt", "erf", "erfc", "erf_inv", "lgamma", "digamma", "igamma",
    "bessel_i0e", "bessel_i1e",
})

_ELEMENTWISE = _TRANSCENDENTAL | frozenset({
    "add", "add_any", "sub", "mul", "div", "rem", "max", "min", "neg", "abs", "sign",
    "floor", "ceil", "round", "is_finite", "integer_pow", "square", "reciprocal",
    "select_n", "clamp", "convert_element_type", "eq", "ne", "gt", "ge", "lt", "le",
    "and", "or", "not", "xor", "shift_left", "shift_right_logical",
    "shift_right_arithmetic", "nextafter", "copy", "copy_p", "stop_gradient", "real",
    "imag", "conj", "complex", "population_count", "clz",
})

#: Ops that fuse with their neighbours (elementwise and data movement).
_LOOP_FUSIBLE = _ELEMENTWISE | frozenset({
    "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "iota", "slice",
    "concatenate", "pad", "rev", "dynamic_slice",
    "pvary",    # a type cast in shard_map bodies: no code
})

#: Ops that absorb fusible producers but materialize their results.
_REDUCE_FUSIBLE = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin", "reduce_precision",
})


def is_half_float(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and getattr(dtype, "name", "") in ("bfloat16", "float16")


def is_half_precision_matmul(eqn: JaxprEqn) -> bool:
    return (eqn.primitive.name in ("dot_general", "conv_general_dilated")
            and len(eqn.outvars) == 1
            and any(is_half_float(getattr(a, "aval", None)) for a in eqn.invars))


def elements(aval: Any) -> int:
    shape = getattr(aval, "shape", None)
    return math.prod(shape) if shape is not None else 0


def primitive_cost(eqn: JaxprEqn) -> tuple[float, float]:
    """``(flops, transcendentals)`` of one equation (not control flow: its cost is
    its body's, see ``to_graph``)."""
    name = eqn.primitive.name
    out_elements = sum(elements(v.aval) for v in eqn.outvars)
    if name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        lhs_shape = eqn.invars[0].aval.shape
        contracted = math.prod(lhs_shape[d] for d in lhs_contract)
        return 2.0 * out_elements * contracted, 0.0
    if name == "conv_general_dilated":
        rhs = eqn.invars[1].aval.shape
        out_feature_dim = eqn.params["dimension_numbers"].rhs_spec[0]
        per_output = math.prod(rhs) // max(1, rhs[out_feature_dim])
        return 2.0 * out_elements * per_output, 0.0
    if name in _TRANSCENDENTAL:
        return float(out_elements), float(out_elements)
    if name in _REDUCE_FUSIBLE or name.startswith("reduce") or name.startswith("cum"):
        return float(sum(elements(v.aval) for v in eqn.invars)), 0.0
    return float(out_elements), 0.0


#: What moving one byte between devices costs, in FLOPs: an accelerator does some
#: hundreds to thousands of FLOPs in the time its links move a byte; the low end is
#: taken, so that a collective is recomputed only where no local computation does
#: as well, yet is not ruled out (gathering a layer's weights again in the backward
#: is what fully sharded data parallelism is).
COMMUNICATION_FLOPS_PER_BYTE = 100.0


def communicates(eqn: JaxprEqn, partitioned: bool = True) -> bool:
    """Whether ``eqn`` may move data between devices: a collective
    (:data:`COLLECTIVES`), a sharding annotation in a ``partitioned`` program
    (:data:`SHARDING_ANNOTATIONS`), or an equation with a body (``shard_map``,
    loops, conditionals) that holds one. The planning graph adds the bytes it
    moves, at :data:`COMMUNICATION_FLOPS_PER_BYTE`, to the op's cost."""
    name = eqn.primitive.name
    if name in COLLECTIVES or (partitioned and name in SHARDING_ANNOTATIONS):
        return True
    return any(communicates(e, partitioned) for e in _inner_equations(eqn))


def repeatable(eqn: JaxprEqn) -> bool:
    """Whether a second run of ``eqn`` gives the same results and repeats no
    effect, as far as its bodies go (``Op.repeatable``): it has no effects, and
    no equation of its bodies is one the planner never runs twice
    (:data:`~remat.core.algorithms.recomputable.NOT_RECOMPUTABLE`) or holds
    one. Its own primitive is the planner's to judge."""
    return not eqn.effects and all(
        e.primitive.name not in NOT_RECOMPUTABLE and repeatable(e)
        for e in _inner_equations(eqn))


def _inner_equations(eqn: JaxprEqn):
    """The equations of ``eqn``'s bodies (branches, loop bodies, called jaxprs)."""
    for param in eqn.params.values():
        for body in (param if isinstance(param, (tuple, list)) else (param,)):
            inner = getattr(body, "jaxpr", body)
            if hasattr(inner, "eqns"):
                yield from inner.eqns


def fusion_kind(name: str) -> str:
    """The fusion kind (``"loop"``, ``"reduce"`` or ``"none"``) of a primitive."""
    if name in _LOOP_FUSIBLE:
        return "loop"
    if name in _REDUCE_FUSIBLE:
        return "reduce"
    return "none"

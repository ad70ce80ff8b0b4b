"""Which ops may run twice: everything but effects and non-deterministic ops."""

from __future__ import annotations

from ..graph import Graph

#: Ops whose second run could differ from the first or repeat an effect.
NOT_RECOMPUTABLE = frozenset({
    "rng_uniform", "rng_bit_generator", "random_seed", "io_callback",
    "debug_callback", "debug_print", "pure_callback", "infeed", "outfeed",
    "send", "recv", "while", "scan", "cond", "get", "swap", "addupdate",
    "new_ref", "freeze", "all_reduce", "psum", "all_gather", "all_to_all",
    "ppermute", "reduce_scatter", "psum_scatter",
})


def recomputable(graph: Graph, op_id: int) -> bool:
    """Whether ``op_id`` may be recomputed."""
    return graph.ops[op_id].label not in NOT_RECOMPUTABLE

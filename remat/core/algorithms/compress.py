"""``"compress"``: keep a smaller form of a value instead of the value.

Lossless and nearly free: when a large value is a cheap expansion of a smaller
one (a broadcast, an iota, a widening convert, a reshape or transpose of such), do
not keep it; keep its small source and rebuild it where it is needed again. The
greedy engine does the bookkeeping; this strategy only admits chains of such ops
whose inputs are smaller than their outputs, so nothing heavy is recomputed.
Not done: packing boolean masks into bits (no bit-packing op is emitted).
"""

from __future__ import annotations

from ..graph import Graph
from ..options import RematOptions
from ..scheduled import Scheduled
from .greedy import run_greedy
from .recomputable import recomputable
from .result import PlanResult
from .sweep import Strategy

__all__ = ["plan_compress", "is_expansion", "COMPRESS"]

#: Ops that only move or widen data.
EXPANSIONS = frozenset({
    "broadcast_in_dim", "iota", "convert_element_type", "reshape", "transpose",
    "squeeze", "expand_dims", "concatenate", "pad", "select_n", "copy",
})


def is_expansion(graph: Graph, op_id: int) -> bool:
    """Whether the op is data movement whose outputs outweigh its inputs."""
    op = graph.ops[op_id]
    if op.label not in EXPANSIONS or not recomputable(graph, op_id):
        return False
    read = sum(graph.values[v].nbytes for v in set(op.inputs))
    written = sum(graph.values[v].nbytes for v in op.outputs)
    return read < written or op.label in ("reshape", "transpose", "squeeze",
                                          "expand_dims", "copy")


COMPRESS = Strategy(allows=is_expansion, start_depth=4, grow=False)


def plan_compress(scheduled: Scheduled, options: RematOptions) -> PlanResult:
    """Plans with the ``"compress"`` algorithm (see the module docstring)."""
    return run_greedy(scheduled, options, [COMPRESS])

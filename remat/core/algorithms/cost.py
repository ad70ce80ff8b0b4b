"""The recompute cost of an op, as every algorithm counts it.

``flops + 10 * transcendentals`` (the weighting of the seed's "path" algorithm).

>>> from remat.core.graph import GraphBuilder
>>> b = GraphBuilder()
>>> x = b.add_input(8)
>>> _ = b.add_op("exp", [x], [8], flops=2, transcendentals=1)
>>> op_cost(b.build(outputs=[]), 0)
12.0
"""

from __future__ import annotations

from ..graph import Graph

__all__ = ["op_cost"]


def op_cost(graph: Graph, op_id: int) -> float:
    """The cost of running ``op_id`` again."""
    op = graph.ops[op_id]
    return op.flops + 10.0 * op.transcendentals

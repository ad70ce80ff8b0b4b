"""DFS scheduler, in the spirit of XLA's ``DFSMemoryScheduler``.

A depth-first post-order from the outputs that visits, at each op, first the operand
subtrees with the most *extra users* (values read by more than one op: finishing
them early lets their buffers die sooner) and then the largest ones (by the bytes
their subtree defines). Both figures accumulate over the subtree, as in XLA; on DAGs
they over-count shared parts, which is the heuristic's intent, and are capped.
"""

from __future__ import annotations

from ..fusion import resident_bytes
from ..graph import Graph
from ._traverse import post_order, root_ops

__all__ = ["dfs_schedule"]

_CAP = 1 << 62  # keeps the accumulated figures small ints on wide DAGs


def dfs_schedule(graph: Graph) -> tuple[int, ...]:
    """Schedules ``graph`` depth-first, heaviest operand subtrees first.

    Example::

        >>> from remat.core.graph import GraphBuilder
        >>> b = GraphBuilder(); x = b.add_input(4)
        >>> (small,) = b.add_op("small", [x], [4]); (big,) = b.add_op("big", [x], [400])
        >>> (out,) = b.add_op("add", [small, big], [4])
        >>> dfs_schedule(b.build(outputs=[out]))
        (1, 0, 2)
    """
    resident = resident_bytes(graph)
    n = len(graph.ops)
    extra_users = [0] * n
    subtree_bytes = [0] * n
    predecessors = [graph.op_predecessors(o) for o in range(n)]
    for op_id in graph.topological_order:
        op = graph.ops[op_id]
        extra = sum(max(0, len(graph.users[v]) - 1) for v in op.outputs)
        size = sum(resident[v] for v in op.outputs)
        for p in predecessors[op_id]:
            extra += extra_users[p]
            size += subtree_bytes[p]
        extra_users[op_id] = min(extra, _CAP)
        subtree_bytes[op_id] = min(size, _CAP)

    def visit_order(op_id: int) -> list[int]:
        preds = predecessors[op_id]
        return sorted(preds, key=lambda p: (-extra_users[p], -subtree_bytes[p]))

    return post_order(graph, root_ops(graph), visit_order)

"""Post-order scheduler: a depth-first post-order from the program outputs.

Each op runs as soon as all the operands it needs have been computed, visiting
operands in operand order (as XLA's post-order scheduler does). Ops that no output
depends on are scheduled afterwards, from the last such op back.
"""

from __future__ import annotations

from ..graph import Graph
from ._traverse import post_order, root_ops

__all__ = ["postorder_schedule"]


def postorder_schedule(graph: Graph) -> tuple[int, ...]:
    """Schedules ``graph`` by a depth-first post-order from its outputs.

    Example::

        >>> from remat.core.graph import GraphBuilder
        >>> b = GraphBuilder(); x = b.add_input(4)
        >>> (y,) = b.add_op("a", [x], [4]); (z,) = b.add_op("b", [x], [4])
        >>> postorder_schedule(b.build(outputs=[z, y]))
        (1, 0)
    """
    return post_order(graph, root_ops(graph), lambda op_id: graph.op_predecessors(op_id))

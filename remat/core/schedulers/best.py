"""The default scheduler: try the others, keep the lowest simulated peak.

As XLA's default memory scheduler does, it runs the list, DFS and post-order
schedulers and keeps the schedule whose simulated peak (``remat.core.simulate``) is
lowest; ties go to the earlier one in that order.
"""

from __future__ import annotations

from ..graph import Graph
from ..simulate import simulate
from .dfs import dfs_schedule
from .list import list_schedule
from .postorder import postorder_schedule

__all__ = ["best_schedule", "CANDIDATES"]

#: The schedulers ``best_schedule`` tries, in tie-breaking order.
CANDIDATES = (list_schedule, dfs_schedule, postorder_schedule)


def best_schedule(graph: Graph) -> tuple[int, ...]:
    """The candidate schedule of ``graph`` with the lowest simulated peak.

    Example::

        >>> from remat.core.graph import GraphBuilder
        >>> b = GraphBuilder(); x = b.add_input(4)
        >>> (y,) = b.add_op("a", [x], [8])
        >>> best_schedule(b.build(outputs=[y]))
        (0,)
    """
    best: tuple[int, ...] | None = None
    best_peak = 0
    for scheduler in CANDIDATES:
        schedule = scheduler(graph)
        peak = simulate(graph, schedule, check=False).peak_bytes
        if best is None or peak < best_peak:
            best, best_peak = schedule, peak
    assert best is not None
    return best

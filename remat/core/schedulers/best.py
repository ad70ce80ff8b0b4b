"""The default scheduler: try the others, keep the lowest simulated peak.

As XLA's default memory scheduler does, it runs the list, DFS and post-order
schedulers and keeps the schedule whose simulated peak (``remat.core.simulate``) is
lowest; ties go to the earlier one in that order.
"""

from __future__ import annotations

from ..graph import Graph
from ..simulate import Timeline, simulate
from .dfs import dfs_schedule
from .list import list_schedule
from .postorder import postorder_schedule

__all__ = ["best_schedule", "best_schedule_and_timeline", "ranked_schedules",
           "CANDIDATES"]

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
    return best_schedule_and_timeline(graph)[0]


def best_schedule_and_timeline(graph: Graph, *, reuse_result_buffers: bool = False
                               ) -> tuple[tuple[int, ...], Timeline]:
    """:func:`best_schedule` and its simulated timeline (saves a simulation);
    ``reuse_result_buffers`` is passed to ``simulate``."""
    return ranked_schedules(graph, reuse_result_buffers=reuse_result_buffers)[0]


def ranked_schedules(graph: Graph, *, reuse_result_buffers: bool = False
                     ) -> list[tuple[tuple[int, ...], Timeline]]:
    """The candidates' distinct schedules with their timelines, lowest simulated
    peak first (ties in :data:`CANDIDATES` order)."""
    ranked: list[tuple[tuple[int, ...], Timeline]] = []
    for scheduler in CANDIDATES:
        schedule = scheduler(graph)
        if any(schedule == seen for seen, _ in ranked):
            continue
        ranked.append((schedule, simulate(graph, schedule, check=False,
                                          reuse_result_buffers=reuse_result_buffers)))
    ranked.sort(key=lambda pair: pair[1].peak_bytes)   # stable: ties keep the order
    return ranked

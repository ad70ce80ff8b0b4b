"""Schedulers: each is a function ``(graph) -> tuple of op ids`` (a topological order).

Pick one by name with :func:`get_scheduler`; ``"best"`` tries the others.
"""

from __future__ import annotations

from typing import Callable

from ..graph import Graph
from .best import best_schedule
from .dfs import dfs_schedule
from .list import list_schedule
from .postorder import postorder_schedule

__all__ = ["SCHEDULERS", "get_scheduler", "best_schedule", "dfs_schedule",
           "list_schedule", "postorder_schedule"]

Scheduler = Callable[[Graph], tuple[int, ...]]

#: Every scheduler by name.
SCHEDULERS: dict[str, Scheduler] = {
    "postorder": postorder_schedule,
    "dfs": dfs_schedule,
    "list": list_schedule,
    "best": best_schedule,
}


def get_scheduler(name: str) -> Scheduler:
    """The scheduler called ``name``; raises ``ValueError`` naming the choices."""
    try:
        return SCHEDULERS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; choose one of "
                         f"{sorted(SCHEDULERS)}.") from None

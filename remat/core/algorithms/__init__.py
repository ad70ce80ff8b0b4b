"""Automatic rematerialization algorithms: each ``(graph, schedule, options) ->
PlanResult``, pick one by name with :func:`get_algorithm`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..graph import Graph
from ..options import RematOptions
from .compress import is_expansion, plan_compress
from .optimal import plan_optimal
from .path import plan_path
from .recomputable import recomputable
from .result import PlanResult, consolidated
from .standard import plan_standard
from .standardcompress import plan_standardcompress

__all__ = ["ALGORITHMS", "get_algorithm", "may_recompute", "consolidated", "PlanResult"]

Algorithm = Callable[[Graph, Sequence[int], RematOptions], PlanResult]

ALGORITHMS: dict[str, Algorithm] = {
    "standard": plan_standard,
    "path": plan_path,
    "compress": plan_compress,
    "standardcompress": plan_standardcompress,
    "optimal": plan_optimal,
}


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called ``name``; raises ``ValueError`` naming the choices."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of "
                         f"{sorted(ALGORITHMS)}.") from None


def may_recompute(name: str) -> Callable[[Graph, int], bool]:
    """Which ops the algorithm called ``name`` may run again (for
    :func:`remat.core.bounds.planner_floor`)."""
    return is_expansion if name == "compress" else recomputable

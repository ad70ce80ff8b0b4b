"""Automatic rematerialization algorithms: each ``(scheduled, options) ->
PlanResult``, pick one by name with :func:`get_algorithm`.

An algorithm receives the graph on one order of its ops as a
:class:`~remat.core.scheduled.Scheduled` (made by
:func:`~remat.core.scheduled.on_schedule`); give every call on that order the
same one, so that what one call works out serves the next.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> from remat.core.scheduled import on_schedule
    >>> b = GraphBuilder()
    >>> x = b.add_input(10)
    >>> (a,) = b.add_op("f", [x], [100], flops=5)
    >>> (c,) = b.add_op("f", [a], [100], flops=5)
    >>> (y,) = b.add_op("g", [c], [10])
    >>> (z,) = b.add_op("h", [y, a], [10])
    >>> s = on_schedule(b.build(outputs=[z]), (0, 1, 2, 3))
    >>> r = get_algorithm("path")(s, RematOptions(220, "path", small_node_bytes=0))
    >>> r.met, r.regions, r.baseline is s.timeline
    (True, (Region(recompute=(0,), consumers=(3,)),), True)
"""

from __future__ import annotations

from collections.abc import Callable

from ..graph import Graph
from ..options import RematOptions
from ..scheduled import Scheduled
from .compress import is_expansion, plan_compress
from .optimal import plan_optimal
from .path import plan_path
from .recomputable import recomputable
from .segments import plan_segments
from .result import PlanResult, consolidated
from .standard import plan_standard
from .standardcompress import plan_standardcompress

__all__ = ["ALGORITHMS", "get_algorithm", "may_recompute", "consolidated", "PlanResult"]

Algorithm = Callable[[Scheduled, RematOptions], PlanResult]

ALGORITHMS: dict[str, Algorithm] = {
    "standard": plan_standard,
    "path": plan_path,
    "compress": plan_compress,
    "standardcompress": plan_standardcompress,
    "optimal": plan_optimal,
    "segments": plan_segments,
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

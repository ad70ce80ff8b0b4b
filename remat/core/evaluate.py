"""The measure every planner's plan is checked by: apply the regions, simulate.

:func:`evaluate` applies regions to a graph on its schedule
(:func:`remat.core.plan.apply_plan`) and simulates the rewritten program
(:func:`remat.core.simulate.simulate`). Planners evaluate the same regions again
(a re-aimed sweep that picks the same values, both starts of ``"standard"``
trying the same merges), so the :class:`~remat.core.scheduled.Scheduled` keeps
every peak seen (:func:`known_peak`: a trial known to miss a limit need not be
simulated again) and the last few results, returned again as they were.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> from remat.core.plan import Region
    >>> from remat.core.scheduled import on_schedule
    >>> b = GraphBuilder()
    >>> x = b.add_input(8)
    >>> (a,) = b.add_op("f", [x], [100])
    >>> (y,) = b.add_op("g", [a], [8])
    >>> (z,) = b.add_op("h", [y], [8])
    >>> (w,) = b.add_op("k", [z, a], [8])
    >>> s = on_schedule(b.build(outputs=[w]), (0, 1, 2, 3))
    >>> regions = [Region(recompute=(0,), consumers=(3,))]
    >>> known_peak(s, regions) is None
    True
    >>> rewritten, timeline = evaluate(s, regions)
    >>> s.timeline.peak_bytes, timeline.peak_bytes, known_peak(s, regions)
    (132, 124, 124)
"""

from __future__ import annotations

import math
from typing import Sequence

from .plan import PlanError, Region, Rewritten, apply_plan
from .scheduled import Scheduled
from .simulate import Timeline, simulate

__all__ = ["evaluate", "known_peak"]

#: Peaks a :class:`Scheduled` keeps (then it starts again), and whole results.
_PEAKS_KEPT = 4096
_RESULTS_KEPT = 4


def evaluate(scheduled: Scheduled, regions: Sequence[Region]
             ) -> tuple[Rewritten, Timeline]:
    """Applies ``regions`` on ``scheduled`` and simulates the result. Raises
    :class:`~remat.core.plan.PlanError` as ``apply_plan`` does. A result kept
    from an earlier call is returned again: treat it as read-only."""
    caches = scheduled.caches
    if len(caches.peaks) >= _PEAKS_KEPT:
        caches.peaks.clear()
        caches.results.clear()
    key = tuple(regions)
    if key in caches.results:
        caches.results.move_to_end(key)
        return caches.results[key]
    try:
        rewritten = apply_plan(scheduled, regions)
    except PlanError:
        caches.peaks[key] = math.inf
        raise
    result = rewritten, simulate(rewritten.graph, rewritten.schedule, check=False)
    caches.peaks[key] = result[1].peak_bytes
    caches.results[key] = result
    if len(caches.results) > _RESULTS_KEPT:
        caches.results.popitem(last=False)
    return result


def known_peak(scheduled: Scheduled, regions: Sequence[Region]) -> float | None:
    """The simulated peak of ``regions`` on ``scheduled`` if :func:`evaluate`
    has worked it out before (infinite if the regions could not be realized),
    else None."""
    return scheduled.caches.peaks.get(tuple(regions))

"""A graph on one running order: what every planning algorithm receives.

An algorithm plans one :class:`~remat.core.graph.Graph` on one schedule (a
topological order of its ops). What it needs of that pair beyond the graph (each
op's step, the step where each op really runs once fusion is counted, the
simulation of the order) and what the algorithms work out about it and share
(the blocks of regions, the peaks of the plans simulated, the sweeps taken) live
in one :class:`Scheduled`, made by :func:`on_schedule`. The graph holds nothing
of any schedule: it never changes once made.

The rule: make one ``Scheduled`` per graph and order, and hand the same object to
every algorithm that plans on that order (``algorithm(scheduled, options)``). Its
caches make later calls cheaper (a planner asks for many limits, and
``"optimal"`` runs ``"path"`` and ``"standard"`` first); they never change an
answer, so a fresh ``Scheduled`` gives the same plans, only slower.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_input(100)
    >>> (y,) = b.add_op("f", [x], [200])
    >>> (z,) = b.add_op("g", [y], [50])
    >>> s = on_schedule(b.build(outputs=[z]), (0, 1))
    >>> s.position, s.timeline.peak_bytes
    ((0, 1), 350)
    >>> on_schedule(s.graph, (1, 0))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    remat.core.simulate.ScheduleError: op 1 (g) runs at step 0 but reads value 1, ...
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

from .graph import Graph
from .simulate import Timeline, anchor_steps, check_schedule, simulate

__all__ = ["Scheduled", "Caches", "on_schedule"]


@dataclasses.dataclass(eq=False)
class Caches:
    """What the algorithms work out about one graph on one order, kept for the
    next call. Each is filled, and bounded, by the module named (the keys and
    values are that module's business); all of it is true of the graph and
    order whatever the options, so it is shared by every algorithm.

    Attributes:
      blocks: ``remat.core.plan``: each region's consumers with their fusions,
        and its block.
      peaks: ``remat.core.evaluate``: the simulated peak of each set of regions
        evaluated (infinite if it could not be realized).
      results: ``remat.core.evaluate``: the last few rewritten programs and
        their simulations.
      merges: ``algorithms.consolidate``: the last few consolidations.
      trajectories: ``algorithms.sweep``: each strategy's sweep, per setting.
      rebuild_peaks: ``algorithms.estimate``: the bytes a chain's rebuild holds.
      segmentations: ``algorithms.segments``: its plans, per small-node limit.
    """

    blocks: dict[Any, Any] = dataclasses.field(default_factory=dict)
    peaks: dict[Any, float] = dataclasses.field(default_factory=dict)
    results: collections.OrderedDict = dataclasses.field(
        default_factory=collections.OrderedDict)
    merges: collections.OrderedDict = dataclasses.field(
        default_factory=collections.OrderedDict)
    trajectories: dict[Any, Any] = dataclasses.field(default_factory=dict)
    rebuild_peaks: dict[Any, int] = dataclasses.field(default_factory=dict)
    segmentations: dict[Any, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class Scheduled:
    """A graph on one schedule (see the module docstring). Made by
    :func:`on_schedule`; only ``caches`` changes afterwards.

    Attributes:
      graph: the program.
      schedule: its op ids in running order (a checked topological order).
      position: for each op id, its step in ``schedule``.
      anchor: for each op id, the step at which it really runs: a fused op runs
        with the last op consuming its chain (:func:`~remat.core.simulate.anchor_steps`).
      timeline: the simulation of ``schedule`` (``reuse_result_buffers`` off, as
        planners count).
      caches: what algorithms worked out so far (:class:`Caches`).
    """

    graph: Graph
    schedule: tuple[int, ...]
    position: tuple[int, ...]
    anchor: tuple[int, ...]
    timeline: Timeline
    caches: Caches = dataclasses.field(default_factory=Caches, repr=False)

    def __repr__(self) -> str:
        return (f"Scheduled({self.graph!r}, peak {self.timeline.peak_bytes} bytes "
                f"at step {self.timeline.peak_step})")


def on_schedule(graph: Graph, schedule: Sequence[int], *,
                timeline: Timeline | None = None, check: bool = True) -> Scheduled:
    """``graph`` on ``schedule``, with nothing worked out yet.

    Arguments:
      graph: the program.
      schedule: every op id once, in a topological order.
      timeline: ``simulate(graph, schedule)`` if it was already made (e.g. by
        :func:`remat.core.schedulers.best.ranked_schedules`), else it is made.
      check: verify that ``schedule`` is a topological order of every op
        (raises :class:`~remat.core.simulate.ScheduleError`).
    """
    schedule = tuple(schedule)
    if check:
        check_schedule(graph, schedule)
    if timeline is None:
        timeline = simulate(graph, schedule, check=False)
    elif timeline.schedule != schedule:
        raise ValueError("on_schedule: the timeline given simulates another "
                         "schedule; pass the simulation of this one, or none.")
    elif any(timeline.in_output_buffer):
        raise ValueError("on_schedule: the timeline given was simulated with "
                         "reuse_result_buffers=True; planners count without it, "
                         "so pass a simulation made without it, or none.")
    position = [0] * len(graph.ops)
    for step, op_id in enumerate(schedule):
        position[op_id] = step
    return Scheduled(graph, schedule, tuple(position),
                     tuple(anchor_steps(graph, schedule)), timeline)

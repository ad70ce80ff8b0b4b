"""The plans of the automatic pass's columns: one algorithm on one order, per target.

A column of the search (:class:`remat.core.columns.Column`) asks for a plan at
each rung it compiles. :class:`ColumnPlans` makes them for one program and
setting, every (algorithm, order) of it. Rules:

* A plan depends only on its algorithm, order and model target: each is planned
  once and kept, whoever asks for it first (a column, the same column under
  another lowering, or the planner guessing where the search will start).
* The small-node limit of a target is the one given; else the default, halved
  while the values it keeps put the target below the planner's floor, and none
  if even :data:`SMALLEST_SMALL_NODE` does.
* A heuristic's plan that missed its target is consolidated within its own
  peak (the same peak, less recompute).
* ``"optimal"`` in the default solves for at most :data:`OPTIMAL_DEFAULT_SECONDS`,
  and searches a target out of reach for its plan of least peak for at most
  :data:`LEAST_PEAK_DEFAULT_SECONDS`. Once a target is out of reach (the solver
  proved it infeasible, or found no selection meeting it in its time), every
  lower target with the same small-node limit is answered, unsolved, by the plan
  of least peak found then: a lower target's selections are a subset.

>>> from remat.core.graph import GraphBuilder
>>> from remat.core.options import RematOptions
>>> from remat.core.scheduled import on_schedule
>>> b = GraphBuilder()
>>> x = b.add_input(8)
>>> (a,) = b.add_op("f", [x], [100], flops=10)
>>> (y,) = b.add_op("g", [a], [8])
>>> (z,) = b.add_op("h", [y, a], [8])
>>> plans = ColumnPlans([on_schedule(b.build(outputs=[z]), (0, 1, 2))],
...                     RematOptions(0, "path"))
>>> targets = plans.rungs("path", 0)
>>> plan = plans.of("path", 0)
>>> plan(targets[0]) is plan(targets[0]), plans.of("path", 0) is plan
(True, True)
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

from .algorithms import consolidated, get_algorithm, may_recompute
from .algorithms.optimal import plan_optimal
from .algorithms.segments import with_followers
from .bounds import planner_floor
from .gc_pause import gc_paused
from .options import PORTFOLIO, RematOptions
from .scheduled import Scheduled
from .columns import Candidate, rungs

__all__ = ["ColumnPlans", "LEAST_PEAK_DEFAULT_SECONDS", "OPTIMAL_DEFAULT_SECONDS",
           "SMALLEST_SMALL_NODE"]

#: The time limit of each of ``"optimal"``'s solves in the default (seconds; the
#: best selection found by then is used): it is tried after the heuristics.
OPTIMAL_DEFAULT_SECONDS = 5.0
#: The time limit of ``"optimal"``'s search for its plan of least peak, for a
#: target out of reach, in the default (seconds). The heuristics' plans of least
#: peak stand beside it, so it pays only where it finds a lower one quickly: on
#: the random programs most that found one did so within a second, and most
#: that ran longer found none.
LEAST_PEAK_DEFAULT_SECONDS = 1.0
#: The smallest default small-node limit tried before none at all (bytes).
SMALLEST_SMALL_NODE = 4096


class ColumnPlans:
    """The plans of every (algorithm, order) of one program under one setting.

    Arguments:
      orders: the orders planned on, each with its simulation.
      options: the settings (the algorithm asked for, small-node limit, solver
        time); each plan's target and algorithm replace theirs.

    ``seconds`` is the time spent planning so far. A candidate's payload is
    ``(result, small_node_bytes, None)``: the plan, the small-node limit it was
    made under, and the lowering (the default; a column may ask for another).
    """

    def __init__(self, orders: Sequence[Scheduled], options: RematOptions):
        self.orders, self.options = tuple(orders), options
        self.seconds = 0.0
        self._floors: dict[tuple[int, int, bool], int] = {}
        self._plans: dict[tuple[str, int], Callable[[int], Candidate]] = {}

    def add_order(self, scheduled: Scheduled) -> None:
        """Plans on one more order too (the next index)."""
        self.orders += (scheduled,)

    def floor(self, order: int, small: int, algorithm: str) -> int:
        """The planner's floor on an order with a small-node limit (model bytes)."""
        key = (order, small, may_recompute(algorithm))    # algorithms share it
        if key not in self._floors:
            scheduled = self.orders[order]
            self._floors[key] = planner_floor(scheduled.graph, scheduled.timeline,
                                              small, key[2])
        return self._floors[key]

    def small_node_bytes(self, order: int, target: int, algorithm: str) -> int:
        """The small-node limit for a target (the module's rule)."""
        small = self.options.small_node_bytes
        if self.options.small_node_given:
            return small
        while small > SMALLEST_SMALL_NODE and self.floor(order, small, algorithm) > target:
            small //= 2
        return small if self.floor(order, small, algorithm) <= target else 0

    def rungs(self, algorithm: str, order: int) -> tuple[int, ...]:
        """The model targets a column of ``algorithm`` on ``order`` plans for."""
        least = self.options.small_node_bytes if self.options.small_node_given else 0
        return rungs(self.floor(order, least, algorithm),
                     self.orders[order].timeline.peak_bytes)

    def of(self, algorithm: str, order: int) -> Callable[[int], Candidate]:
        """A model target -> the :class:`Candidate` of ``algorithm`` on ``order``
        for it (the same function for every caller)."""
        if (algorithm, order) not in self._plans:
            self._plans[algorithm, order] = self._planning(algorithm, order)
        return self._plans[algorithm, order]

    def whole(self, order: int) -> Callable[[int], Candidate]:
        """A model target -> ``"segments"``' plan on ``order`` for it, each region
        holding its followers (:func:`~remat.core.algorithms.segments.with_followers`;
        the segments plan itself where no region has one)."""
        if ("segments, whole", order) not in self._plans:
            segments, scheduled = self.of("segments", order), self.orders[order]

            def plan(target: int) -> Candidate:
                cand = segments(target)
                result, small, lowering = cand.payload
                start = time.perf_counter()
                with gc_paused():
                    realized = with_followers(scheduled, result)
                self.seconds += time.perf_counter() - start
                if realized is result:
                    return cand
                return Candidate(realized.regions, realized.timeline.peak_bytes,
                                 realized.extra_flops, (realized, small, lowering))

            self._plans["segments, whole", order] = functools.cache(plan)
        return self._plans["segments, whole", order]

    def _planning(self, algorithm: str, order: int) -> Callable[[int], Candidate]:
        scheduled = self.orders[order]
        # optimal, by small-node limit: the highest target out of reach, and the
        # plan of least peak found then
        out_of_reach: dict[int, tuple[int, Candidate]] = {}
        planned: dict[int, Candidate] = {}
        seconds, least_peak_seconds = self.options.solver_seconds, None
        if algorithm == "optimal" and self.options.algorithm == PORTFOLIO:
            seconds = min(seconds, OPTIMAL_DEFAULT_SECONDS)
            least_peak_seconds = LEAST_PEAK_DEFAULT_SECONDS

        def plan(target: int) -> Candidate:
            if target in planned:
                return planned[target]
            start = time.perf_counter()
            small = self.small_node_bytes(order, target, algorithm)
            highest, least_peak = out_of_reach.get(small, (-1, None))
            if target <= highest:       # out of reach: the solver would search in vain
                self.seconds += time.perf_counter() - start
                return least_peak
            options = dataclasses.replace(self.options, model_target_bytes=target,
                                          algorithm=algorithm, small_node_bytes=small,
                                          solver_seconds=seconds)
            with gc_paused():
                if algorithm == "optimal":
                    # its plan of least peak, searched once, serves every
                    # target out of reach
                    result = plan_optimal(scheduled, options,
                                          least_peak.payload[0] if least_peak else None,
                                          least_peak_seconds)
                else:
                    result = get_algorithm(algorithm)(scheduled, options)
                    if result.small_node_bytes is not None:   # the variant kept
                        small = result.small_node_bytes
                if not result.met and algorithm != "optimal":
                    result = consolidated(scheduled, result, result.timeline.peak_bytes)
            self.seconds += time.perf_counter() - start
            cand = Candidate(result.regions, result.timeline.peak_bytes,
                             result.extra_flops, (result, small, None))
            if not result.met and result.status in ("infeasible", "time_limit"):
                out_of_reach[small] = (max(target, highest), least_peak or cand)
            planned[target] = cand
            return cand

        return plan

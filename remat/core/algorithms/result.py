"""What a planning algorithm returns, and how plans are compared and consolidated.

A :class:`PlanResult` holds the regions an algorithm chose, the rewritten program
they give and its simulation, next to the simulation of the original program.
A plan *meets* its limit when its simulated peak is at most ``limit_bytes``.

Comparing plans (:func:`best_of`): among plans that meet their limit the one of
least extra recompute wins; if none does, the lowest simulated peak wins, then
the least recompute. Ties go to the first plan given.

Consolidating a plan (:func:`consolidated`) merges its regions that rebuild the
same ops while the simulated peak stays within a bound, so the plan keeps its
limit and never recomputes more. Each merge trial simulates the whole program;
:func:`cheapest_consolidated` consolidates only the plans that can still beat
the cheapest consolidated one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..graph import Graph
from ..options import RematOptions
from ..plan import Region, Rewritten
from ..scheduled import Scheduled
from ..simulate import Timeline
from .consolidate import merge_regions_simulated

__all__ = ["PlanResult", "best_of", "consolidated", "cheapest_consolidated",
           "cheapest_consolidated_at", "least_flops",
           "small_node_variants", "tagged"]


@dataclasses.dataclass(frozen=True)
class PlanResult:
    """What an algorithm chose, and the rewritten program it gives.

    Attributes:
      regions: the recomputation regions (original op ids).
      rewritten: the rewritten program and its schedule.
      timeline: the simulation of ``rewritten``.
      baseline: the simulation of the original program.
      limit_bytes: the limit planned for (model bytes).

    What a solver proved (``"optimal"``; the defaults elsewhere):
      status: ``"optimal"`` (proven, under the estimate), ``"time_limit"`` (the
        best plan found when the time limit stopped the solver; see ``gap``),
        ``"infeasible"`` (no selection meets the limit: the plan with the least
        estimated peak instead), ``"heuristic"`` (the plan of ``"path"`` or
        ``"standard"``, whose regions are candidates too, met the limit and was
        cheaper than anything the solver found), or ``"no_candidates"``; ``""``
        for the heuristics.
      gap: the proven relative gap of the last solve, ``(cost - bound) / cost``
        (0.0 when optimal; None when nothing was solved).
      bound: the solver's lower bound on the recompute cost (``flops + 10 *
        transcendentals``) of any selection meeting the (estimated) limit.
      solve_seconds: the time spent in the solver, all rounds together.
      num_candidates: how many candidates the program chose among.
      rounds: how many times the program was solved.
      small_node_bytes: the small-node limit the plan was made under, where the
        algorithm planned under several (:func:`small_node_variants`); None: the
        one given.
    """

    regions: tuple[Region, ...]
    rewritten: Rewritten
    timeline: Timeline
    baseline: Timeline
    limit_bytes: int
    status: str = ""
    gap: float | None = None
    bound: float | None = None
    solve_seconds: float = 0.0
    num_candidates: int = 0
    rounds: int = 0
    small_node_bytes: int | None = None

    @property
    def met(self) -> bool:
        return self.timeline.peak_bytes <= self.limit_bytes

    @property
    def extra_flops(self) -> float:
        return self.rewritten.extra_flops


def best_of(results: Sequence[PlanResult]) -> PlanResult:
    """The cheapest plan that meets its limit, else the cheapest with the lowest peak."""
    met = [r for r in results if r.met]
    if met:
        return min(met, key=lambda r: r.extra_flops)
    return min(results, key=lambda r: (r.timeline.peak_bytes, r.extra_flops))


def cheapest_consolidated(scheduled: Scheduled,
                          results: Sequence[PlanResult]) -> PlanResult:
    """:func:`cheapest_consolidated_at`'s plan."""
    return cheapest_consolidated_at(scheduled, results)[0]


def cheapest_consolidated_at(scheduled: Scheduled, results: Sequence[PlanResult]
                             ) -> tuple[PlanResult, int | None]:
    """:func:`best_of` ``results`` once each that meets its limit is
    :func:`consolidated` within it, consolidating only those that can still win.
    Merging regions leaves each op they recompute recomputed at least once, so
    a plan whose recomputed ops, each counted once, cost more than the cheapest
    consolidated plan so far cannot beat it, and is not consolidated (each merge
    trial simulates the whole program). Returns it and its index in ``results``
    (None where none meets its limit)."""
    met = [i for i, r in enumerate(results) if r.met]
    if not met:
        return best_of(results), None
    best, best_index = None, -1
    for bound, i in sorted((least_flops(scheduled.graph, results[i]), i) for i in met):
        if best is not None and bound * (1 - 1e-9) > best.extra_flops:
            continue
        merged = consolidated(scheduled, results[i], results[i].limit_bytes)
        # the first of equally cheap plans wins, as in best_of
        if best is None or (merged.extra_flops, i) < (best.extra_flops, best_index):
            best, best_index = merged, i
    return best, best_index


def least_flops(graph: Graph, result: PlanResult) -> float:
    """The FLOPs of the ops ``result`` recomputes, each counted once: the least
    any merging of its regions can recompute."""
    recomputed = set().union(*(r.recompute for r in result.regions))
    return sum(graph.ops[o].flops for o in recomputed)


def consolidated(scheduled: Scheduled, result: PlanResult, within: int) -> PlanResult:
    """``result`` with its regions that rebuild the same ops merged while the
    simulated peak stays within ``within`` bytes (consolidate.py); the result
    keeps ``result``'s limit. Each try simulates the whole program, so big
    programs get fewer (a count, not a time budget: plans stay reproducible).
    A plan that missed its limit can be consolidated within its own peak: the
    same peak for less recompute."""
    _, simulated = merge_regions_simulated(
        scheduled, result.regions, within,
        max_trials=max(8, 20_000 // max(scheduled.graph.num_ops, 1)),
        base=(result.rewritten, result.timeline))
    if simulated is None:     # no merge kept
        return result
    rw, tl = simulated
    return dataclasses.replace(result, regions=tuple(rw.regions), rewritten=rw, timeline=tl)


def tagged(result: PlanResult, options: RematOptions) -> PlanResult:
    """``result`` marked with the small-node limit of the settings it was made under."""
    return dataclasses.replace(result, small_node_bytes=options.small_node_bytes)


def small_node_variants(options: RematOptions) -> list[RematOptions]:
    """The settings a heuristic plans under: ``options``, and, where its small-node
    limit is the default (not given), the same with none. The default keeps the
    greedy off small values; where their drops are the cheap ones, the plan under
    none meets the target for less recompute (:func:`cheapest_consolidated` picks).

    >>> o = RematOptions(100, "path", small_node_bytes=1024)
    >>> [v.small_node_bytes for v in small_node_variants(o)]
    [1024, 0]
    >>> small_node_variants(RematOptions(100, "path", small_node_bytes=1024,
    ...                                  small_node_given=True)) == [
    ...     RematOptions(100, "path", small_node_bytes=1024, small_node_given=True)]
    True
    """
    if options.small_node_given or not options.small_node_bytes:
        return [options]
    return [options, dataclasses.replace(options, small_node_bytes=0)]

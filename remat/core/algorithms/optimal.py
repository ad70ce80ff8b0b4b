"""``"optimal"``: the least recompute cost under the limit, by integer programming.

The yardstick for the heuristics. Over the given schedule, every way this planner
knows to drop a value is enumerated as a *candidate*, and an integer program
(HiGHS through ``scipy.optimize.milp``) picks the set of candidates of least total
recompute cost whose estimated memory stays within the limit at every step.
The candidates (a value, the gap between two of its readers where it is dropped,
the chain that rebuilds it) are enumerated by
:mod:`~remat.core.algorithms.optimal_candidates`; the integer program (its
variables and constraints) is built and solved by
:mod:`~remat.core.algorithms.optimal_program`. The regions of the ``"path"``
and ``"standard"`` plans are candidates too, so the optimum is never worse than
theirs under the estimate; and if either met the limit more cheaply than
anything the solver found (the estimate misjudged, or the time limit stopped
it), that plan is returned, marked ``status="heuristic"``.

So the result is optimal over *one-level regions built from these candidates,
under the linear memory estimate*, on the given schedule; it is not optimal over
every possible recomputation (Checkmate's space, which also moves ops and nests
recomputation). The estimate is checked the only way every algorithm is checked:
the regions are applied (:func:`~remat.core.plan.apply_plan`) and the rewritten
program simulated (:func:`~remat.core.simulate.simulate`). If the simulation is over
the limit (a block waits for ops the estimate placed after it, overlapping blocks
are merged), the miss is charged to the rebuilds whose blocks were over the limit
(to every candidate with the same chain and readers) and the program is solved
again; if the peak is outside those blocks, it is solved aiming lower by the
miss. A plan the machinery cannot realize is excluded and the program solved
again. The best plan that meets the limit is returned, else the one with the
least simulated peak. So the cost is optimal for the estimate *as corrected by
the simulations seen*; ``status``, ``gap`` and ``bound`` are those of the last
solve.

When the time limit (``options.solver_seconds``) stops the solver, the best plan
found so far is returned with its proven relative gap (``PlanResult.gap``). A
limit no selection can meet is reported with ``status="infeasible"``, and one
the solver found no selection for in its time with ``status="time_limit"``: the
plan returned then has the least estimated peak of the selection of least peak
(searched in the time left, if any, at most ``least_peak_seconds``) and the
``"path"`` and ``"standard"`` plans.

Example::

    >>> from remat.core.options import RematOptions
    >>> from remat.core.scheduled import on_schedule
    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_input(10)
    >>> a1, = b.add_op("f", [x], [100], flops=5)
    >>> a2, = b.add_op("f", [a1], [100], flops=5)
    >>> y, = b.add_op("g", [a2], [10])
    >>> z, = b.add_op("h", [y, a1], [10])
    >>> g = b.build(outputs=[z])
    >>> s = on_schedule(g, (0, 1, 2, 3))
    >>> r = plan_optimal(s, RematOptions(220, "optimal", small_node_bytes=0))
    >>> r.met, r.extra_flops, r.status
    (True, 5.0, 'optimal')
"""

from __future__ import annotations

import dataclasses
import logging
import time
from ..evaluate import evaluate
from ..options import RematOptions
from ..plan import PlanError, Region
from ..scheduled import Scheduled
from .greedy import cheapest_greedy, plan_exchanged
from .optimal_candidates import candidates
from .optimal_program import Program
from .path import plan_path
from .result import PlanResult
from .standard import STANDARD, STANDARD_WIDE

__all__ = ["plan_optimal"]

log = logging.getLogger("remat")

#: Times the program is solved again after the simulation disagrees.
_ROUNDS = 12


def plan_optimal(scheduled: Scheduled, options: RematOptions,
                 least_peak: PlanResult | None = None,
                 least_peak_seconds: float | None = None) -> PlanResult:
    """Plans with the ``"optimal"`` algorithm (see the module docstring).

    ``least_peak``: the plan of least peak found before on the same schedule (an
    ``"infeasible"`` or ``"time_limit"`` result for another limit); returned, with
    this limit, for a limit no selection meets, instead of searching for it
    again. That search is the slow part of a limit out of reach: it runs in the
    time the solves left, at most ``least_peak_seconds`` (None: no more limit).
    """
    limit = options.model_target_bytes
    clock = time.perf_counter()
    graph, baseline = scheduled.graph, scheduled.timeline
    # seeds: the greedy's plans before exchanges (the solver's own candidates
    # hold what an exchange finds); the exchanged plan is a heuristic's too
    starts = (STANDARD, STANDARD_WIDE)
    greedy = cheapest_greedy(scheduled, options, starts)
    heuristics = [plan_path(scheduled, options), greedy[0]]
    seeds = [r for h in heuristics for r in h.regions]
    cands = candidates(scheduled, options, seeds)
    program = Program(baseline, cands)
    say = log.info if options.verbose else log.debug
    say("remat optimal: %d ops, %d candidates, %d exclusive groups, %d conflicts "
        "(%.2f s)", graph.num_ops, len(cands), len(program.groups),
        len(program.conflicts), time.perf_counter() - clock)

    def result(regions, rw, tl, **kw) -> PlanResult:
        return PlanResult(tuple(rw.regions), rw, tl, baseline, limit,
                             num_candidates=len(cands), **kw)

    if baseline.peak_bytes <= limit or not cands:
        rw, tl = evaluate(scheduled, [])
        return result([], rw, tl, status="optimal" if baseline.peak_bytes <= limit
                      else "no_candidates", gap=0.0 if baseline.peak_bytes <= limit
                      else None, bound=0.0 if baseline.peak_bytes <= limit else None)

    deadline = clock + options.solver_seconds
    target = limit
    best: PlanResult | None = None
    solve_s = 0.0
    status, gap, bound = "", None, None
    rounds = 0
    for rounds in range(1, _ROUNDS + 1):
        left = deadline - time.perf_counter()
        if left <= 0 and best is not None:
            break
        t0 = time.perf_counter()
        res, nrows = program.solve(target, left, options.verbose)
        solve_s += time.perf_counter() - t0
        say("remat optimal: round %d, target %d bytes, %d rows: %s (%.2f s)", rounds,
            target, nrows, res.message, time.perf_counter() - t0)
        if res.x is None:
            if best is not None:
                break       # aiming lower went out of reach: keep what met before
            status = "infeasible" if res.status == 2 else "time_limit"
            break
        chosen = [i for i in range(len(cands)) if res.x[i] > 0.5]
        gap = float(res.mip_gap) if res.mip_gap is not None else None
        bound = float(res.mip_dual_bound) if res.mip_dual_bound is not None else None
        status = "optimal" if res.status == 0 else "time_limit"
        regions = [Region(cands[i].chain, cands[i].consumers) for i in chosen]
        try:
            rw, tl = evaluate(scheduled, regions)
        except PlanError as e:
            say("remat optimal: selection rejected by apply_plan (%s); excluded", e)
            program.cuts.append(chosen)
            continue
        got = result(regions, rw, tl, status=status, gap=gap, bound=bound)
        say("remat optimal: %d candidates chosen, cost %.4g, simulated peak %d bytes "
            "(limit %d)", len(chosen), float(program.cost[chosen].sum()),
            tl.peak_bytes, limit)
        if (best is None or (got.met and not best.met)
                or (got.met == best.met and (
                    got.extra_flops < best.extra_flops if got.met
                    else tl.peak_bytes < best.timeline.peak_bytes))):
            best = got
        if got.met:
            break
        # The simulation saw more than the estimate. Where a rebuild's block is
        # over the limit, charge the miss to the candidates in it (their block
        # holds more than the estimate knew); elsewhere, aim lower by the miss.
        in_charged_block = False
        step_of = {op: step for step, op in enumerate(rw.schedule)}
        for i in chosen:
            # originals keep their ids in the rewrite: a consumer's block is its region
            k = rw.region[cands[i].consumers[0]] if cands[i].consumers else -1
            if k < 0:
                continue
            first = step_of[rw.blocks[k][0]]
            steps = range(first, first + len(rw.blocks[k]))   # blocks are contiguous
            miss = max(tl.live_during_bytes[s] for s in steps) - limit
            if miss > 0:
                program.charge(i, miss)
                in_charged_block |= tl.peak_step in steps
        if not in_charged_block:
            target -= tl.peak_bytes - limit
    if best is None and least_peak is not None:
        best = dataclasses.replace(least_peak, limit_bytes=limit, status=status or "infeasible",
                                   gap=None, bound=None)
        say("remat optimal: limit %d bytes out of reach (%s); the least peak known %d",
            limit, best.status, best.timeline.peak_bytes)
    elif best is None:
        # nothing meets the limit: the least estimated peak instead, searched in
        # the time the solve left (none left: the heuristics' least, below)
        left = deadline - time.perf_counter()
        if least_peak_seconds is not None:
            left = min(left, least_peak_seconds)
        res = program.least_peak(left, options.verbose)[0] if left > 0 else None
        chosen = ([i for i in range(len(cands)) if res.x[i] > 0.5]
                  if res is not None and res.x is not None else [])
        regions = [Region(cands[i].chain, cands[i].consumers) for i in chosen]
        try:
            rw, tl = evaluate(scheduled, regions)
        except PlanError:
            rw, tl = evaluate(scheduled, [])
        best = result(regions, rw, tl, status=status or "infeasible", gap=None,
                      bound=None)
        say("remat optimal: limit %d bytes out of reach (%s); least peak %s %d",
            limit, best.status, "found" if res is not None else "not searched (no time "
            "left), the plain program's", tl.peak_bytes)
    exchanged = plan_exchanged(scheduled, options, starts, greedy)     # = plan_standard's
    known = [h for h in (*heuristics, exchanged) if h.met]
    if known:
        cheapest = min(known, key=lambda h: h.extra_flops)
        if not best.met or cheapest.extra_flops < best.extra_flops:
            # A heuristic's plan (its regions are candidates too) beats every
            # selection the solver found or proved under the estimate.
            say("remat optimal: keeping a heuristic's plan (%s)", best.status)
            best = result(cheapest.regions, cheapest.rewritten, cheapest.timeline,
                          status="heuristic", gap=None, bound=bound)
    elif not best.met:      # out of reach: the least simulated peak known
        lowest = min(heuristics, key=lambda h: h.timeline.peak_bytes)
        if lowest.timeline.peak_bytes < best.timeline.peak_bytes:
            best = result(lowest.regions, lowest.rewritten, lowest.timeline,
                          status=best.status, gap=None, bound=None)
    return dataclasses.replace(best, solve_seconds=solve_s, rounds=rounds)

"""The greedy engine the seed's algorithms share: plan, check, re-aim.

In the spirit of XLA's ``HloRematerialization``: drop values live at the peak,
best bytes per recompute cost first, until the peak is under the limit
(:mod:`~remat.core.algorithms.sweep`, over the linear memory estimate of
:mod:`~remat.core.algorithms.estimate`). The regions chosen are then applied once
(``remat.core.evaluate.evaluate``) and simulated for real; if the real peak is over
the limit, the engine sweeps again aiming lower by the difference (``_REAIM``
sweeps in all at most), unless the sweep ran out of values to drop and none were
given back: aiming lower would drop the same.

Each run plans both ways a drop that an earlier region's chain reads can be
rebuilt (by each region needing it, or, as a segment, by the one region that
needs it) and keeps the cheaper plan that meets the limit
(:func:`~remat.core.algorithms.result.best_of`), consolidated unless asked not to.
A plan whose regions cannot be realized ends its run, which keeps the best plan
it had.

Exchanges (:func:`plan_exchanged`, for ``standard``): the greedy
never takes back a dear drop that later drops made unneeded unless nothing
replaces it; planning again with that drop's op banned lets the sweep free the
bytes elsewhere, kept only where it meets the limit for less recompute. A sweep
with ops banned replays the prefix of the unbanned one up to its first drop
through a banned op (``sweep.py``), so an exchange costs the rest of a sweep.

Cost of an op: ``flops + 10 * transcendentals`` (``cost.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ..evaluate import evaluate
from ..options import RematOptions
from ..plan import PlanError
from ..scheduled import Scheduled
from .cost import op_cost
from .estimate import Drop, Estimate
from .result import (PlanResult, best_of, cheapest_consolidated_at, consolidated,
                     least_flops, small_node_variants, tagged)
from .sweep import Strategy, swept

__all__ = ["run_greedy", "give_back", "plan_exchanged", "cheapest_greedy"]

#: Times the engine re-aims when the real simulation misses the estimate.
_REAIM = 4
#: The least share of a plan's extra FLOPs the ops an exchange bans must cost
#: for it to be tried. Banning ops saves about their cost at most (the bytes
#: they freed are freed another way, at some cost), and the automatic pass does
#: not compile a plan for a smaller saving than this share
#: (:data:`remat.core.search.MIN_SAVING`, the same figure).
EXCHANGE_SHARE = 0.05


def give_back(est: Estimate, target: int) -> list[Drop]:
    """The drops worth keeping: walks them from the most to the least expensive
    per byte and puts back each one whose return keeps the estimated peak within
    ``target`` (de-rematerialization). Drops tied to others (one grew the other's
    chain) stay."""
    kept = list(est.drops)
    free = [d for k, d in enumerate(est.drops) if not d.extends and k not in est.extended]
    for d in sorted(free, key=lambda d: d.score):
        est.apply(d, sign=-1)
        if est.peak()[0] <= target:
            kept.remove(d)
        else:
            est.apply(d, sign=1)
    return kept


def plan_exchanged(scheduled: Scheduled, options: RematOptions,
                   starts: Sequence[Strategy],
                   base: tuple[PlanResult, tuple | None] | None = None) -> PlanResult:
    """:func:`cheapest_greedy`'s plan improved by exchanges on the settings
    that planned it (start, small-node variant, segment mode): while
    the plan meets the limit, plan again with its dearest recomputed op banned
    too (first with every op like it, same label and cost: a layer's op
    repeated; then alone), and keep that plan if it meets the limit with less
    recompute. Where no ban pays, the ops like the dearest of the last round a
    single ban paid are banned in its place, each from that round's plan, and the
    cheapest plan that beats the current one goes on from there (the first
    exchange that pays can lead where none pays after it, and another further).

    A sweep takes, at each peak step, the drop that frees most per cost; a dear
    drop taken early stays paid for when later drops would free the same bytes
    (give-back returns a drop only where nothing else is needed in its place);
    banned, its op leaves the sweep to free those bytes another way. Never
    recomputes more than :func:`cheapest_greedy`'s plan. ``base``: what
    :func:`cheapest_greedy` returned for these arguments, if the caller has it."""
    best, settings = base or cheapest_greedy(scheduled, options, starts)
    if settings is None:
        return best
    opts, start, merge = settings
    graph = scheduled.graph
    tried: dict[frozenset, PlanResult | None] = {}   # by the ops banned

    def improved(banned: frozenset, bans: list[frozenset]):
        """The cheapest plan that meets the limit for less than ``best``, banning
        ``banned`` and one of ``bans``, with what it bans (None if none does)."""
        found = None
        for ban in bans:
            if sum(graph.ops[o].flops for o in ban) < EXCHANGE_SHARE * best.extra_flops:
                continue
            if banned | ban not in tried:
                tried[banned | ban] = _run(
                    scheduled, opts, [dataclasses.replace(start, banned=banned | ban)],
                    give_back, merge)
            trial = tried[banned | ban]
            cap = best if found is None else found[0]
            # merging regions leaves each op recomputed at least once: a plan
            # whose ops, once each, cost as much as the cap is not consolidated
            if (trial is not None and trial.met
                    and least_flops(graph, trial) < cap.extra_flops):
                trial = consolidated(scheduled, trial, trial.limit_bytes)
                if trial.extra_flops < cap.extra_flops:
                    found = tagged(trial, opts), banned | ban
        return found

    banned, last = frozenset(), None    # last: the round a single ban paid, its others
    while True:
        recomputed = {o for region in best.regions for o in region.recompute} - banned
        found = None
        if recomputed:
            dearest = max(sorted(recomputed), key=lambda o: op_cost(graph, o))
            alike = sorted(o for o in recomputed if _kind(graph, o) == _kind(graph, dearest))
            found = improved(banned, [frozenset(alike)])
            if found is None and len(alike) > 1:
                found = improved(banned, [frozenset({dearest})])
                if found is not None:
                    last = banned, [frozenset({o}) for o in alike if o != dearest]
        if found is None and last is not None:      # stalled: that round, the others
            found, last = improved(*last), None
        if found is None:
            return best
        best, banned = found


def _kind(graph, o: int) -> tuple[str, float]:
    """What makes ops alike for an exchange: their label and cost."""
    return graph.ops[o].label, op_cost(graph, o)


def cheapest_greedy(scheduled: Scheduled, options: RematOptions,
                    starts: Sequence[Strategy]
                    ) -> tuple[PlanResult, tuple[RematOptions, Strategy, bool] | None]:
    """:func:`run_greedy` from each of ``starts`` under each of
    :func:`~remat.core.algorithms.result.small_node_variants` (the variant under
    no small-node limit first: the others' sweeps may replay its own, sweep.py),
    the cheapest once consolidated (:func:`cheapest_consolidated_at`); with the
    settings that planned it, its segment mode last (None if no plan meets the
    limit)."""
    variants = small_node_variants(options)
    settings = [(opts, start) for opts in variants for start in starts]
    planned: dict[int, tuple[PlanResult, bool]] = {}
    for i in sorted(range(len(settings)), key=lambda i: -variants.index(settings[i][0])):
        opts, start = settings[i]
        ways = {merge: r for merge in (False, True)
                if (r := _run(scheduled, opts, [start], give_back, merge))}
        if not ways:    # no realizable plan: the program as written, limit not met
            rw, tl = evaluate(scheduled, [])
            planned[i] = PlanResult((), rw, tl, scheduled.timeline,
                                    options.model_target_bytes), False
            continue
        result = best_of(list(ways.values()))
        planned[i] = tagged(result, opts), next(m for m, r in ways.items() if r is result)
    best, index = cheapest_consolidated_at(scheduled, [planned[i][0]
                                                       for i in range(len(settings))])
    if index is None:
        return best, None
    return best, (*settings[index], planned[index][1])


def run_greedy(scheduled: Scheduled, options: RematOptions,
               phases: Sequence[Strategy],
               keep: Callable[[Estimate, int], list[Drop]] | None = None,
               consolidate: bool = True) -> PlanResult:
    """Plans with the estimate, checks with the simulator, re-aims if needed.

    ``phases`` run one after the other on the same estimate (e.g. compress, then
    standard). ``keep``, if given, prunes the drops chosen for a target (``path``'s
    de-rematerialization) before they are applied. It plans twice, with and
    without merging drops into the regions that need them (segments: less
    recomputation, more memory held), and returns the cheaper plan that meets the
    limit (:func:`consolidated` unless ``consolidate`` is false), or else the one
    with the lower peak.
    """
    results = [r for merge in (False, True)
               if (r := _run(scheduled, options, phases, keep, merge))]
    if not results:   # no realizable plan: the program as written, limit not met
        rw, tl = evaluate(scheduled, [])
        return PlanResult((), rw, tl, scheduled.timeline, options.model_target_bytes)
    best = best_of(results)
    if not best.met or not consolidate:
        return best
    return consolidated(scheduled, best, best.limit_bytes)


def _run(scheduled: Scheduled, options: RematOptions, phases: Sequence[Strategy],
         keep, merge_segments: bool) -> PlanResult | None:
    """One planning run: sweep with the estimate, simulate, re-aim if short.
    A plan whose regions cannot be realized (merged regions depending on each
    other in a cycle, or a rebuild reading a value its own block defines later)
    ends the run, which returns the best plan it had (None if it had none)."""
    limit = options.model_target_bytes
    best: PlanResult | None = None
    target = limit
    for _ in range(_REAIM):
        est = swept(scheduled, merge_segments, target, options, phases)
        drops = est.drops
        if keep is not None:
            drops = keep(est, target)
        try:
            rw, tl = evaluate(scheduled, est.regions(drops))
        except PlanError:
            break
        result = PlanResult(tuple(rw.regions), rw, tl, scheduled.timeline, limit)
        if best is None or (tl.peak_bytes, rw.extra_flops) < (
                best.timeline.peak_bytes, best.extra_flops):
            best = result
        if result.met or not drops:
            break
        if est.exhausted and len(drops) == len(est.drops):
            # Aiming lower drops the same values, and gives none back if none
            # came back at this target: the same regions again.
            break
        target -= tl.peak_bytes - limit     # the estimate was optimistic: aim lower
    return best

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

Cost of an op: ``flops + 10 * transcendentals`` (``cost.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..evaluate import evaluate
from ..options import RematOptions
from ..plan import PlanError
from ..scheduled import Scheduled
from .estimate import Drop, Estimate
from .result import PlanResult, best_of, consolidated
from .sweep import Strategy, swept

__all__ = ["run_greedy", "give_back"]

#: Times the engine re-aims when the real simulation misses the estimate.
_REAIM = 4


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

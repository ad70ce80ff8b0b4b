"""Merging regions that recompute the same ops, checked by the simulator.

The greedy engine frees values one at a time, so two regions often rebuild the
same stretch: in a checkpointed chain, the region serving layer ``j``'s backward
recomputes layers ``1..j`` of the segment and the one serving layer ``j - 1``
recomputes ``1..j-1`` again, which doubles the recomputation of a segment.
One region serving both rebuilds the stretch once and holds the copies from the
first rebuild to the last reader: less compute, more memory.

:func:`merge_regions` merges greedily, the pair sharing the most recompute cost
first, and keeps the longest run of merges after which the rewritten program,
simulated for real, is still within the limit. Most merges fit, so the whole run
is checked first, in one simulation; when it does not fit, the first merge that
breaks the limit is found by bisection, left out, and merging goes on from the
run before it, probing 1, 2, 4, ... merges from then on (near the limit, breaking
merges come thick). A merge left out also rules out, for the rest of the call,
every merge of two regions that each hold one side of it (their recompute and
consumers): the block would be bigger and hold more copies for longer. A merge
judged to break the limit by the copies it would hold on top of the last
simulation, with the merges the run took before it and the copies of the
blocks the merged block swallows (:class:`HeldCopies`), is not tried. A wrong
judgement costs recompute, never a plan over the limit, since every merge kept
was simulated.
``max_trials`` bounds the trials; a trial whose regions are known to miss the
limit (simulated before, in this or an earlier merge run:
:func:`remat.core.evaluate.known_peak`) is not simulated again.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> from remat.core.plan import Region
    >>> from remat.core.scheduled import on_schedule
    >>> b = GraphBuilder()
    >>> x = b.add_input(10)
    >>> (a,) = b.add_op("f", [x], [100], flops=50)
    >>> (c,) = b.add_op("g", [a], [100], flops=50)
    >>> (y,) = b.add_op("h", [c], [10])
    >>> (z,) = b.add_op("h", [y, c], [10])
    >>> (w,) = b.add_op("h", [z, a], [10])
    >>> g = b.build(outputs=[w])
    >>> two = [Region((0, 1), (3,)), Region((0,), (4,))]
    >>> merge_regions(on_schedule(g, tuple(range(5))), two, limit_bytes=1000)
    [Region(recompute=(0, 1), consumers=(3, 4))]
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ..evaluate import evaluate, known_peak
from ..plan import PlanError, Region, Rewritten
from ..scheduled import Scheduled
from ..simulate import Timeline
from .cost import op_cost
from .held_copies import HeldCopies

__all__ = ["merge_regions", "merge_regions_simulated"]


def _merged(a: Region, b: Region) -> Region:
    return Region(tuple(sorted(set(a.recompute) | set(b.recompute))),
                  tuple(sorted(set(a.consumers) | set(b.consumers))))


def _fits(scheduled: Scheduled, regions: Sequence[Region],
          limit_bytes: int) -> tuple[Rewritten, Timeline] | None:
    """The rewritten program and its simulation if it is within the limit (not
    simulated again if an earlier evaluation of these regions missed it)."""
    known = known_peak(scheduled, regions)
    if known is not None and known > limit_bytes:
        return None
    try:
        rewritten, timeline = evaluate(scheduled, regions)
    except PlanError:     # merged regions depending on each other in a cycle
        return None
    return (rewritten, timeline) if timeline.peak_bytes <= limit_bytes else None


def _covers(rejected, a: tuple[frozenset, frozenset], b: tuple[frozenset, frozenset]
            ) -> bool:
    """Whether merging regions ``a`` and ``b`` (each as its recompute and consumer
    sets) would merge (at least) the two regions of a ``rejected`` merge: each of
    ``a`` and ``b`` holds one of them. A bigger block holds more copies for longer."""
    for p, q in rejected:
        if ((p[0] <= a[0] and p[1] <= a[1] and q[0] <= b[0] and q[1] <= b[1]) or
                (p[0] <= b[0] and p[1] <= b[1] and q[0] <= a[0] and q[1] <= a[1])):
            return True
    return False


def _merge_run(regions: Sequence[Region], costs: Sequence[float], rejected: set,
               held: HeldCopies | None = None) -> list[tuple[list[Region], tuple]]:
    """Greedy merges from ``regions`` until no pair (other than those covering a
    ``rejected`` merge, see :func:`_covers`, or those ``held`` says break the
    limit) shares recompute cost (``costs``: per op): after each merge, the
    regions and the pair merged (as their recompute and consumer sets)."""
    active = dict(enumerate(regions))    # insertion order: merged ones go last
    ops = {i: frozenset(r.recompute) for i, r in active.items()}
    sets = {i: (ops[i], frozenset(r.consumers)) for i, r in active.items()}
    heap: list[tuple[float, int, int]] = []

    def pair(i: int, j: int) -> None:
        shared = ops[i] & ops[j]
        if shared and not _covers(rejected, sets[i], sets[j]):
            saving = sum(costs[o] for o in shared)
            if saving > 0:
                heapq.heappush(heap, (-saving, i, j))

    ids = list(active)
    for a, i in enumerate(ids):
        for j in ids[a + 1:]:
            pair(i, j)
    run = []
    while heap:
        _, i, j = heapq.heappop(heap)
        if i not in active or j not in active:
            continue
        key = (sets[i], sets[j])
        if held is not None and held.over(*key):
            continue
        new = len(regions) + len(run)
        active[new] = _merged(active.pop(i), active.pop(j))
        ops[new] = ops.pop(i) | ops.pop(j)
        sets[new] = (ops[new], sets.pop(i)[1] | sets.pop(j)[1])
        run.append((list(active.values()), key))
        for k in list(active)[:-1]:
            pair(k, new)
    return run


def merge_regions(scheduled: Scheduled, regions: Sequence[Region],
                  limit_bytes: int, max_trials: int = 200) -> list[Region]:
    """``regions`` with pairs that share recomputed ops merged, as long as the
    simulated peak of the rewritten program stays within ``limit_bytes``."""
    return merge_regions_simulated(scheduled, regions, limit_bytes, max_trials)[0]


def merge_regions_simulated(scheduled: Scheduled,
                            regions: Sequence[Region], limit_bytes: int,
                            max_trials: int = 200,
                            base: tuple[Rewritten, Timeline] | None = None
                            ) -> tuple[list[Region], tuple[Rewritten, Timeline] | None]:
    """:func:`merge_regions`, with the rewritten program and simulation of the
    regions returned when a trial made them (None when no merge was kept).
    ``base``, the rewritten program and simulation of ``regions`` if known, lets
    merges judged to break the limit be skipped untried from the start.

    The last few answers are kept on ``scheduled``: both starts of
    ``"standard"`` often hand over the same regions."""
    key = (tuple(regions), limit_bytes, max_trials)
    memo = scheduled.caches.merges
    if key in memo:
        memo.move_to_end(key)
    else:
        memo[key] = _merge_regions_simulated(scheduled, regions, limit_bytes,
                                             max_trials, base)
        if len(memo) > _MERGES_KEPT:
            memo.popitem(last=False)
    merged, simulated = memo[key]
    return list(merged), simulated


#: Answers of :func:`merge_regions_simulated` a :class:`Scheduled` keeps.
_MERGES_KEPT = 4


def _merge_regions_simulated(scheduled: Scheduled, regions: Sequence[Region],
                             limit_bytes: int, max_trials: int, base):
    graph = scheduled.graph
    regions = list(regions)
    simulated = None        # the simulation of ``regions`` once a merge is kept
    costs = [op_cost(graph, o) for o in range(graph.num_ops)]
    rejected: set[tuple[tuple[frozenset, frozenset], tuple[frozenset, frozenset]]] = set()
    trials = 0

    def fits(merges: list[Region]):
        nonlocal trials
        trials += 1
        return _fits(scheduled, merges, limit_bytes)

    # The first run is checked whole (most merges fit); once one breaks the
    # limit, the limit is near and breaking merges are frequent, so later runs
    # are probed from the start, 1, 2, 4, ... merges.
    whole = True
    while trials < max_trials:
        known = simulated or base
        held = HeldCopies(scheduled, known, limit_bytes) if known else None
        run = _merge_run(regions, costs, rejected, held)
        if not run:
            break
        fit, miss = 0, None     # ``fit`` merges fit; ``miss`` merges do not
        fit_simulated = None
        if whole:
            got = fits(run[-1][0])
            if got:
                return run[-1][0], got
            whole, miss = False, len(run)
        else:
            probe = 1
            while miss is None and trials < max_trials:
                got = fits(run[probe - 1][0])
                if not got:
                    miss = probe
                    continue
                fit, fit_simulated = probe, got
                if probe == len(run):
                    return run[-1][0], got
                probe = min(2 * probe, len(run))
        while miss is not None and miss - fit > 1 and trials < max_trials:
            mid = (fit + miss) // 2
            got = fits(run[mid - 1][0])
            if got:
                fit, fit_simulated = mid, got
            else:
                miss = mid
        if fit:
            regions, simulated = run[fit - 1][0], fit_simulated
        if miss is None or miss - fit > 1:   # out of trials before finding it
            break
        rejected.add(run[miss - 1][1])
    return regions, simulated

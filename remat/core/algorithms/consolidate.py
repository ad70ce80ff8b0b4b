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
blocks the merged block swallows (:class:`_HeldCopies`), is not tried. A wrong
judgement costs recompute, never a plan over the limit, since every merge kept
was simulated.
``max_trials`` bounds the trials; a trial whose regions are known to miss the
limit (simulated before, in this or an earlier merge run:
:func:`remat.core.plan.known_peak`) is not simulated again.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> from remat.core.plan import Region
    >>> b = GraphBuilder()
    >>> x = b.add_input(10)
    >>> (a,) = b.add_op("f", [x], [100], flops=50)
    >>> (c,) = b.add_op("g", [a], [100], flops=50)
    >>> (y,) = b.add_op("h", [c], [10])
    >>> (z,) = b.add_op("h", [y, c], [10])
    >>> (w,) = b.add_op("h", [z, a], [10])
    >>> g = b.build(outputs=[w])
    >>> two = [Region((0, 1), (3,)), Region((0,), (4,))]
    >>> merge_regions(g, tuple(range(5)), two, limit_bytes=1000)
    [Region(recompute=(0, 1), consumers=(3, 4))]
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
import math
import operator
from collections.abc import Sequence

from ..fusion import fused_ops, fused_values
from ..graph import Graph
from ..plan import PlanError, Region, Rewritten, evaluate, known_peak
from ..simulate import Timeline
from .cost import op_cost

__all__ = ["merge_regions", "merge_regions_simulated"]


def _merged(a: Region, b: Region) -> Region:
    return Region(tuple(sorted(set(a.recompute) | set(b.recompute))),
                  tuple(sorted(set(a.consumers) | set(b.consumers))))


def _fits(graph: Graph, schedule: Sequence[int], regions: Sequence[Region],
          limit_bytes: int) -> tuple[Rewritten, Timeline] | None:
    """The rewritten program and its simulation if it is within the limit (not
    simulated again if an earlier evaluation of these regions missed it)."""
    known = known_peak(graph, schedule, regions)
    if known is not None and known > limit_bytes:
        return None
    try:
        rewritten, timeline = evaluate(graph, schedule, regions)
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


class _HeldCopies:
    """Whether a merge would break the limit, judged from the simulation of the
    regions it starts from (no trial needed).

    Merging a region ``x`` into a later ``y`` computes ``y``'s copies in
    ``x``'s block (a block computes its copies first), so the copies ``y``'s
    consumers read are held from there to ``y``'s block: on top of what the
    simulation had live between the two blocks, and on top of ``x``'s block
    (from where each is made among ``x``'s copies; those ``x`` made too, once
    ``x``'s consumers are done with them). Less only what ``y``'s
    copies were the last to read (it may now die at ``x``'s block). Over the
    limit at some such step: the merge is skipped without a trial.
    The blocks between ``x``'s and ``y``'s are taken to join the merged block
    (the convex hull of both consumer sets takes in those on a path between
    them; all of them, to err on the safe side), so their copies, made at its
    start, are held from there to where their own block was. What the late
    blocks read that is made between them by ops that do not depend on the
    early blocks is made before the merged block (which waits for it), so it is
    held across the early blocks too. And the copies only ``y`` made now run
    among ``x``'s, in op order, so the copies they read are held until then; a
    fused one runs with the op reading its results, which for a late consumer
    is at the end of the merged block.
    A merge judged within the limit is taken by the run, so its held copies
    count against the run's later merges (merges that each fit alone can break
    the limit together).
    It is an estimate: ops that move around the merged block are not followed.
    It only decides which merges are tried, so it changes how many trials a
    search makes, never whether a kept merge is within the limit."""

    def __init__(self, graph: Graph, schedule: Sequence[int],
                 base: tuple[Rewritten, Timeline], limit_bytes: int):
        rw, tl = base
        self.graph, self.limit = graph, limit_bytes
        self.position = {op: s for s, op in enumerate(schedule)}
        self.fused = fused_values(graph)
        self.in_fusion = fused_ops(graph)
        self.live = list(tl.live_during_bytes)   # plus the merges taken so far
        step_of = {op: s for s, op in enumerate(rw.schedule)}
        self.spans = [(step_of[b[0]], step_of[b[-1]]) for b in rw.blocks]
        # per block: its copies' steps, and the original positions of their ops
        self.copy_steps = [[step_of[o] for o in b if rw.is_copy[o]] for b in rw.blocks]
        self.copy_positions = [[self.position[rw.origin[o]] for o in b if rw.is_copy[o]]
                               for b in rw.blocks]
        self.block_of = rw.region
        self.last_use = tl.last_use_step
        rgraph = rw.graph
        # per block: bytes of its copies (held from a merged block's start if a
        # merge swallows it)
        self.copy_bytes = [sum(rgraph.values[v].nbytes for o in b if rw.is_copy[o]
                               for v in rgraph.ops[o].outputs if not tl.fused[v])
                           for b in rw.blocks]
        # per block: the original values it reads from outside (step made,
        # bytes, and the blocks their producer depends on, as bits)
        self.reads: list[dict[int, tuple[int, int, int]]] = [{} for _ in rw.blocks]
        below = _blocks_below(rw, (min(s for s, _ in self.spans),
                                   max(s for s, _ in self.spans))) if rw.blocks else []
        # per block: bytes of the originals its copies read last, and the copy
        # of each original value it recomputes
        self.read_last = [0] * len(rw.blocks)
        self.copy_of: list[dict[int, int]] = [{} for _ in rw.blocks]
        for k, block in enumerate(rw.blocks):
            first, last = self.spans[k]
            seen = set()
            for o in block:
                for v in rgraph.ops[o].inputs:
                    p = rgraph.values[v].producer if v < len(graph.values) else None
                    if p is not None and rw.region[p] != k and not tl.fused[v]:
                        self.reads[k][v] = (step_of[p], graph.values[v].nbytes,
                                            below[p])
                if not rw.is_copy[o]:
                    continue
                self.copy_of[k].update(zip(graph.ops[rw.origin[o]].outputs,
                                           rgraph.ops[o].outputs))
                for v in rgraph.ops[o].inputs:
                    if (v not in seen and v < len(graph.values) and not tl.fused[v]
                            and first <= tl.last_use_step[v] <= last):
                        seen.add(v)
                        self.read_last[k] += graph.values[v].nbytes

    def _blocks(self, consumers: frozenset) -> set[int] | None:
        blocks = {self.block_of[c] for c in consumers}
        return None if -1 in blocks else blocks

    def over(self, a: tuple[frozenset, frozenset], b: tuple[frozenset, frozenset]
             ) -> bool:
        """Whether merging ``a`` and ``b`` (recompute and consumer sets) would
        break the limit, by the estimate; if not, the merge's held copies count
        from then on (a run's merges add up)."""
        added = self._added(a, b)
        if added is None:
            return True
        live = self.live
        for start, extra in added:
            for i, e in enumerate(extra):
                live[start + i] += e
        return False

    def _read_by_late_copies(self, a: tuple[frozenset, frozenset],
                             b: tuple[frozenset, frozenset], held: list[int]
                             ) -> dict[int, float]:
        """The values that the late region ``b``'s copies read from other
        copies, each with the original position of its last such reader, where
        it now runs among the merged block's copies (a fused op runs with the
        op reading its results: infinite if that is a consumer, as consumers
        run after every copy). Copies the early region ``a`` made too count
        only when so fused (else they run where they did)."""
        graph, fused, in_fusion = self.graph, self.fused, self.in_fusion
        recomputed, late = a[0] | b[0], b[1]
        ran: dict[int, float] = {}

        def runs_at(o: int) -> float:
            if not in_fusion[o]:
                return self.position[o]
            if o not in ran:
                at = ran[o] = -1
                for w in graph.ops[o].outputs:
                    for u in graph.users[w]:
                        if u in recomputed:
                            at = max(at, runs_at(u))
                        elif u in a[1] or u in late:
                            at = math.inf
                ran[o] = at
            return ran[o]

        until: dict[int, float] = {}
        for o in b[0]:
            at = runs_at(o)
            if o in a[0] and at != math.inf:
                continue
            for v in graph.ops[o].inputs:
                if (v not in held and graph.values[v].producer in recomputed
                        and not fused[v] and at > until.get(v, -1)):
                    until[v] = at
        return until

    def _added(self, a: tuple[frozenset, frozenset], b: tuple[frozenset, frozenset]
               ) -> list[tuple[int, list[int]]] | None:
        """The bytes merging ``a`` and ``b`` adds from each step on (as runs of
        steps: first step, bytes per step), or None if that breaks the limit."""
        ka, kb = self._blocks(a[1]), self._blocks(b[1])
        if not ka or not kb:
            return []
        span_a = (min(self.spans[k][0] for k in ka), max(self.spans[k][1] for k in ka))
        span_b = (min(self.spans[k][0] for k in kb), max(self.spans[k][1] for k in kb))
        if span_b[1] < span_a[0]:
            a, b, ka, kb, span_a, span_b = b, a, kb, ka, span_b, span_a
        if span_a[1] >= span_b[0]:
            return []           # interleaved blocks
        graph, late, values, fused = self.graph, b[1], self.graph.values, self.fused
        held = [v for o in a[0] | b[0] for v in graph.ops[o].outputs
                if not fused[v] and not late.isdisjoint(graph.users[v])]
        room = self.limit + sum(self.read_last[k] for k in kb - ka)
        live = self.live
        held_bytes = sum(values[v].nbytes for v in held)
        added = []
        # what the late blocks read that is made between by ops that do not
        # depend on the early blocks: made before the merged block now
        early_bits = sum(1 << k for k in ka)
        moved = {v: r[:2] for k in kb - ka for v, r in self.reads[k].items()
                 if span_a[1] < r[0] < span_b[0] and not r[2] & early_bits}
        moved_bytes = sum(n for _, n in moved.values())
        if span_a[1] + 1 < span_b[0]:
            lo, hi = span_a[1] + 1, span_b[0]
            delta = [0] * (hi - lo + 1)
            delta[0] = held_bytes
            for m, (start, end) in enumerate(self.spans):   # blocks between: swallowed
                if lo <= start and end < hi:
                    delta[0] += self.copy_bytes[m]
                    delta[start - lo] -= self.copy_bytes[m]
            for v, (made, nbytes) in moved.items():
                delta[0] += nbytes
                delta[made - lo] -= nbytes
            extra = list(itertools.accumulate(delta))[:hi - lo]
            if max(map(operator.add, live[lo:hi], extra)) > room:
                return None
            added.append((lo, extra))
        until = dict.fromkeys(held, math.inf)
        until.update(self._read_by_late_copies(a, b, held))
        for k in ka:        # in an early block
            first, last = self.spans[k]
            steps = self.copy_steps[k]

            def slot(position: float) -> int:
                """The step of the first copy made after ``position``."""
                i = bisect.bisect(self.copy_positions[k], position)
                return steps[i] if i < len(steps) else first + len(steps)

            extra = [0] * (last - first + 2)     # bytes added from each step on
            extra[0] += moved_bytes
            for v, reader in until.items():
                copy = self.copy_of[k].get(v)
                if copy is None:    # made among the block's copies, in op order
                    start = slot(self.position[values[v].producer])
                else:               # held on once the block's consumers are done
                    start = self.last_use[copy] + 1
                end = last + 1 if reader == math.inf else slot(reader)
                if start < end:
                    extra[max(start - first, 0)] += values[v].nbytes
                    extra[end - first] -= values[v].nbytes
            extra.pop()
            extra = list(itertools.accumulate(extra))
            if max(map(operator.add, live[first:last + 1], extra)) > room:
                return None
            added.append((first, extra))
        return added


def _blocks_below(rw: Rewritten, steps: tuple[int, int]) -> list[int]:
    """For each op of ``rw``'s program that runs within ``steps`` (first, last;
    from the first block's start to the last's, as none before depends on a
    block), the blocks it depends on (bit ``k``: block ``k``)."""
    ops, values, region = rw.graph.ops, rw.graph.values, rw.region
    below = [0] * len(ops)
    for o in rw.schedule[steps[0]:steps[1] + 1]:
        bits = 0
        for v in ops[o].inputs:
            p = values[v].producer
            if p is not None:
                bits |= below[p] | (1 << region[p] if region[p] >= 0 else 0)
        below[o] = bits
    return below


def _merge_run(regions: Sequence[Region], costs: Sequence[float], rejected: set,
               held: _HeldCopies | None = None) -> list[tuple[list[Region], tuple]]:
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


def merge_regions(graph: Graph, schedule: Sequence[int], regions: Sequence[Region],
                  limit_bytes: int, max_trials: int = 200) -> list[Region]:
    """``regions`` with pairs that share recomputed ops merged, as long as the
    simulated peak of the rewritten program stays within ``limit_bytes``."""
    return merge_regions_simulated(graph, schedule, regions, limit_bytes,
                                   max_trials)[0]


def merge_regions_simulated(graph: Graph, schedule: Sequence[int],
                            regions: Sequence[Region], limit_bytes: int,
                            max_trials: int = 200,
                            base: tuple[Rewritten, Timeline] | None = None
                            ) -> tuple[list[Region], tuple[Rewritten, Timeline] | None]:
    """:func:`merge_regions`, with the rewritten program and simulation of the
    regions returned when a trial made them (None when no merge was kept).
    ``base``, the rewritten program and simulation of ``regions`` if known, lets
    merges judged to break the limit be skipped untried from the start.

    The last few answers are kept on ``graph``: both starts of ``"standard"``
    often hand over the same regions."""
    key = (tuple(schedule), tuple(regions), limit_bytes, max_trials)
    memo = graph.memo("_merged", collections.OrderedDict)
    if key in memo:
        memo.move_to_end(key)
    else:
        memo[key] = _merge_regions_simulated(graph, schedule, regions, limit_bytes,
                                             max_trials, base)
        if len(memo) > _MERGES_KEPT:
            memo.popitem(last=False)
    merged, simulated = memo[key]
    return list(merged), simulated


#: Answers of :func:`merge_regions_simulated` a graph keeps.
_MERGES_KEPT = 4


def _merge_regions_simulated(graph: Graph, schedule: Sequence[int],
                             regions: Sequence[Region], limit_bytes: int,
                             max_trials: int, base):
    regions = list(regions)
    simulated = None        # the simulation of ``regions`` once a merge is kept
    costs = [op_cost(graph, o) for o in range(graph.num_ops)]
    rejected: set[tuple[tuple[frozenset, frozenset], tuple[frozenset, frozenset]]] = set()
    trials = 0

    def fits(merges: list[Region]):
        nonlocal trials
        trials += 1
        return _fits(graph, schedule, merges, limit_bytes)

    # The first run is checked whole (most merges fit); once one breaks the
    # limit, the limit is near and breaking merges are frequent, so later runs
    # are probed from the start, 1, 2, 4, ... merges.
    whole = True
    while trials < max_trials:
        known = simulated or base
        held = _HeldCopies(graph, schedule, known, limit_bytes) if known else None
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

"""Whether merging two regions would break the limit, judged without a trial.

:func:`~remat.core.algorithms.consolidate.merge_regions` tries merges by
simulating the whole program; :class:`HeldCopies` rules out, from the simulation
of the regions a run starts from, the merges whose held copies would break the
limit, so fewer trials are made (see the class docstring for the estimate).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator

from ..fusion import fused_ops, fused_values
from ..plan import Rewritten
from ..scheduled import Scheduled
from ..simulate import Timeline

__all__ = ["HeldCopies"]


class HeldCopies:
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

    def __init__(self, scheduled: Scheduled, base: tuple[Rewritten, Timeline],
                 limit_bytes: int):
        rw, tl = base
        graph = scheduled.graph
        self.graph, self.limit = graph, limit_bytes
        self.position = scheduled.position
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

"""The greedy engine's memory estimate: bytes live per step, updated per drop.

A sweep must not rebuild the program for each value it drops. An
:class:`Estimate` starts from one :func:`remat.core.simulate.simulate` of the
original program and keeps, per step of the schedule, the bytes live during the
step and after it. Dropping a value (a :class:`Drop`) takes its bytes out of
every step between its last early reader and the step it is needed again
(``freed_until``, exclusive), and puts back, just before each step where a region
rebuilds it, what the rebuild holds on top of what is live (``transients``,
worked out by :func:`with_transients` only for drops actually tried).

A value that an earlier drop's chain reads can be dropped too. Either each
region that needs it recomputes it (the default), or, with ``merge_segments``
and exactly one region needing it, that region also serves the value's own
readers (a *segment*: one recomputation, held longer). The drop then *joins*
that region and is *absorbed*: it gets no region of its own.

Invariant: :meth:`Estimate.apply` with ``sign=-1`` exactly undoes ``sign=1``, so a
drop can be tried and taken back (the sweep's check that a drop does not raise
the peak elsewhere; the engine's de-rematerialization, ``give_back``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..plan import Region
from ..scheduled import Scheduled

__all__ = ["Drop", "Estimate", "with_transients", "TRAJECTORIES_KEPT"]

#: Trajectories a :class:`Scheduled` keeps (then it starts again): strategies x
#: segment modes x small-node limits.
TRAJECTORIES_KEPT = 64


@dataclasses.dataclass(frozen=True)
class Drop:
    """A value not kept after step ``early_end`` until step ``freed_until``
    (exclusive). ``chain`` rebuilds it for its own late readers (``consumers``,
    from ``first_late``) and inside each earlier region whose chain reads it
    (``extends``). Such copies are transient: a value only other chains read is
    gone until its original last use. ``transients`` lists, per step where a
    region rebuilds, the bytes the rebuild holds on top of what is live."""

    value: int
    chain: tuple[int, ...]
    consumers: tuple[int, ...]
    early_end: int
    first_late: int
    nbytes: int
    cost: float
    extends: tuple[int, ...] = ()   # earlier drops whose chains read this value late
    freed_until: int = 0
    transients: tuple[tuple[int, int], ...] = ()

    @property
    def score(self) -> float:
        return self.nbytes / (self.cost + 1.0)


class Estimate:
    """Bytes live per step of a schedule, updated as values are dropped."""

    def __init__(self, scheduled: Scheduled, merge_segments: bool = False):
        self.graph = graph = scheduled.graph
        timeline = scheduled.timeline
        # Whether a drop that one earlier region needs joins that region (one
        # recomputation for both, kept as a segment) instead of getting its own.
        self.merge_segments = merge_segments
        self.live = np.array(timeline.live_during_bytes, dtype=np.int64)
        self.after = np.array(timeline.live_after_bytes, dtype=np.int64)
        # step -> bytes a region's recomputation holds just before that step, on
        # top of what is live after the previous step
        self.transient: dict[int, int] = {}
        self.position = scheduled.position
        self.fused = timeline.fused
        # _rebuild_peak's answers on this order (they depend on nothing else)
        self.rebuild_peaks: dict[tuple, int] = scheduled.caches.rebuild_peaks
        self.born = [-1] * len(graph.values)
        for op, step in enumerate(self.position):
            for v in graph.ops[op].outputs:
                self.born[v] = step
        n = len(scheduled.schedule)
        # The step after which each value is gone: never for inputs and outputs,
        # always for fused values (they never exist in memory to be reused).
        self.dies = [-1 if self.fused[v] else n if d == -1 else d
                     for v, d in enumerate(timeline.last_use_step)]
        self.drops: list[Drop] = []
        # value -> indices of drops whose chain reads it from outside the chain
        self.readers: dict[int, list[int]] = {}
        self.extended: set[int] = set()   # indices of drops whose chains grew
        self.absorbed: set[int] = set()   # drops served by another drop's region
        self.rebuild: dict[int, int] = {}  # region (drop index) -> bytes its rebuild holds
        # Whether a sweep found nothing left to drop short of its target: a sweep
        # for any lower target drops the same values.
        self.exhausted = False
        self.anchor = scheduled.anchor

    def joins(self, extends: Sequence[int]) -> bool:
        """Whether a drop extending these drops joins the one region (a segment)."""
        return self.merge_segments and len(extends) == 1

    def peak(self) -> tuple[int, int]:
        """``(bytes, step)`` of the highest step (or recomputation before it)."""
        step = int(np.argmax(self.live)) if len(self.live) else -1
        best = int(self.live[step]) if step >= 0 else 0
        for s, extra in self.transient.items():
            during = (int(self.after[s - 1]) if s > 0 else 0) + extra
            if during > best:
                best, step = during, s
        return best, step

    def apply(self, d: Drop, sign: int = 1) -> None:
        """Adjusts the live bytes for dropping ``d`` (``sign=1``) or keeping it
        after all (``sign=-1``): the value is gone in its gap, and each rebuild
        briefly holds the copy and the chain's other results."""
        gap = slice(d.early_end + 1, max(d.early_end + 1, d.freed_until))
        self.live[gap] -= sign * d.nbytes
        self.after[gap] -= sign * d.nbytes
        for step, nbytes in d.transients:
            extra = self.transient.get(step, 0) + sign * nbytes
            if extra:
                self.transient[step] = extra
            else:
                self.transient.pop(step, None)

    def add(self, d: Drop) -> None:
        """Records the drop ``d``. The drops it extends now recompute its chain
        too; when it extends exactly one, that drop's region also serves ``d``'s
        own readers (one recomputation kept for both, as a segment)."""
        self.apply(d)
        self.dies[d.value] = d.early_end
        self.drops.append(d)
        index = len(self.drops) - 1
        self.extended.update(d.extends)
        if self.joins(d.extends):
            (k,) = d.extends
            old = self.drops[k]
            self.drops[k] = dataclasses.replace(
                old, chain=tuple(sorted(set(old.chain) | set(d.chain))),
                consumers=tuple(sorted(set(old.consumers) | set(d.consumers))),
                cost=old.cost + d.cost)
            self.rebuild[k] = self.rebuild.get(k, 0) + d.transients[0][1]
            self.absorbed.add(index)
            self._read(k)
            return
        if d.consumers:      # a region of its own
            self.rebuild[index] = d.transients[0][1]
            self._read(index)
        else:                # rebuilt only inside the regions it extends
            self.absorbed.add(index)
        for k, (_, delta) in zip(d.extends, d.transients[1 if d.consumers else 0:]):
            old = self.drops[k]
            self.drops[k] = dataclasses.replace(
                old, chain=tuple(sorted(set(old.chain) | set(d.chain))),
                cost=old.cost + d.cost / (len(d.extends) + bool(d.consumers)))
            self.rebuild[k] = self.rebuild.get(k, 0) + delta
            self._read(k)

    def regions(self, drops: Sequence[Drop] | None = None) -> list[Region]:
        """The regions of the recorded drops (or of ``drops``, a subset of them),
        leaving out those served by another drop's region."""
        kept = self.drops if drops is None else drops
        return [Region(d.chain, d.consumers) for k, d in enumerate(self.drops)
                if k not in self.absorbed and any(d is e for e in kept)]

    def _read(self, k: int) -> None:
        graph, chain = self.graph, set(self.drops[k].chain)
        for o in chain:
            for w in graph.ops[o].inputs:
                p = graph.values[w].producer
                if p not in chain and k not in self.readers.setdefault(w, []):
                    self.readers[w].append(k)


def with_transients(est: Estimate, d: Drop) -> Drop:
    """``d`` with the bytes each rebuild holds (worked out only for the drops
    actually tried: it is the costly part)."""
    if est.joins(d.extends):
        served = set(d.consumers) | set(est.drops[d.extends[0]].consumers)
        held = d.nbytes + _rebuild_peak(est, d.chain, d.value, served)
        return dataclasses.replace(d, transients=((d.first_late, held),))
    transients = []
    if d.consumers:       # its own region, from its first late reader on
        transients.append((d.first_late, d.nbytes + _rebuild_peak(
            est, d.chain, d.value, set(d.consumers))))
    for k in d.extends:   # each region it extends grows by its chain
        region = est.drops[k]
        grown = sorted(set(region.chain) | set(d.chain))
        held = region.nbytes + _rebuild_peak(est, grown, region.value,
                                             set(region.consumers))
        transients.append((region.first_late, held - est.rebuild.get(k, 0)))
    return dataclasses.replace(d, transients=tuple(transients))


def _rebuild_peak(est: Estimate, chain: Sequence[int], v: int,
                  served: set[int]) -> int:
    """The most bytes the chain's results other than ``v`` hold at once while it
    runs (the copy of ``v`` takes the place the original held): each result lives
    until the last op of the chain that reads it, or to the end if an op the
    region serves (``served``) reads it. Kept per order (sweeps ask again)."""
    key = (tuple(chain), v, frozenset(served))
    known = est.rebuild_peaks.get(key)
    if known is None:
        known = est.rebuild_peaks[key] = _work_out_rebuild_peak(est, chain, v, served)
    return known


def _work_out_rebuild_peak(est: Estimate, chain: Sequence[int], v: int,
                           served: set[int]) -> int:
    graph = est.graph
    members = set(chain)
    order = sorted(chain, key=est.position.__getitem__)
    step_of = {o: i for i, o in enumerate(order)}
    live = peak = 0
    ends: dict[int, int] = {}
    for i, o in enumerate(order):
        for w in graph.ops[o].outputs:
            if w == v or est.fused[w]:
                continue
            readers = graph.users[w]
            inside = [step_of[u] for u in readers if u in members]
            last = (len(order) if any(u in served for u in readers)
                    else max(inside, default=i))
            live += graph.values[w].nbytes
            ends[w] = last
        peak = max(peak, live)
        for w, last in list(ends.items()):
            if last == i:
                live -= graph.values[w].nbytes
                del ends[w]
    return peak

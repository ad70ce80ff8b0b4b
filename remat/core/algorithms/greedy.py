"""The greedy engine the seed's algorithms share.

In the spirit of XLA's ``HloRematerialization``: look at the values live at the
peak; for each that is read again after the peak, find the ops that would recompute
it there from values still live at that point (its *chain*); take the one that
frees the most bytes per unit of recompute cost; repeat until the peak is under
the limit. When no candidate's chain fits, allow longer chains (XLA's growing
block size).

Speed: a step must not rebuild the program. The engine keeps, per step of the
schedule, the bytes live (from one :func:`remat.core.simulate.simulate` of the
original program) and updates it as values are dropped: a dropped value stops
occupying memory between its last early reader and its first late reader, and its
chain's outputs occupy memory again at the late reader. The regions it chooses are
then applied once (``remat.core.plan.apply_plan``) and simulated for real; if the
real peak is over the limit, the engine runs again aiming lower by the difference
(unless the sweep ran out of values to drop: aiming lower would drop the same).
Within a sweep, a value's chain is worked out once and reused until a value it
starts from is dropped (``_Chains``), and so is the drop of a value across a
peak step until a drop reads the value or its chain is forgotten. Which value a
sweep drops next never depends on its target, only where it stops, so each
graph keeps each phase's sweep (a :class:`Trajectory`) and later sweeps,
re-aimed or for another attempt, replay it and go on from its end (``swept``).

A value that an earlier region's chain reads can be dropped too: either each
region that needs it recomputes it (the default), or, when one region needs it,
that region also serves the value's own readers (a *segment*: one recomputation,
held longer). The engine plans both ways and keeps the cheaper plan that meets the
limit.

Cost of an op: ``flops + 10 * transcendentals`` (``cost.py``).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence

import numpy as np

from ..graph import Graph
from ..options import RematOptions
from ..plan import PlanError, Region, Rewritten, evaluate
from ..simulate import Timeline, anchor_steps, simulate
from .consolidate import merge_regions_simulated
from .cost import op_cost

__all__ = ["PlanResult", "Strategy", "Drop", "run_greedy", "op_cost", "evaluate",
           "Estimate", "give_back", "best_of", "consolidated", "cheapest_consolidated"]

#: Times the engine re-aims when the real simulation misses the estimate.
_REAIM = 4


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

    @property
    def met(self) -> bool:
        return self.timeline.peak_bytes <= self.limit_bytes

    @property
    def extra_flops(self) -> float:
        return self.rewritten.extra_flops


@dataclasses.dataclass(frozen=True)
class Strategy:
    """How an algorithm restricts the greedy search.

    Attributes:
      allows: ``(graph, op_id) -> bool``: whether an op may be recomputed.
      start_depth: the longest chain to start with.
      grow: whether chains may grow up to ``options.max_chain_ops`` when stuck.
    """

    allows: Callable[[Graph, int], bool]
    start_depth: int = 1
    grow: bool = True


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

    def __init__(self, graph: Graph, schedule: Sequence[int], timeline: Timeline,
                 merge_segments: bool = False):
        self.graph = graph
        # Whether a drop that one earlier region needs joins that region (one
        # recomputation for both, kept as a segment) instead of getting its own.
        self.merge_segments = merge_segments
        self.live = np.array(timeline.live_during_bytes, dtype=np.int64)
        self.after = np.array(timeline.live_after_bytes, dtype=np.int64)
        # step -> bytes a region's recomputation holds just before that step, on
        # top of what is live after the previous step
        self.transient: dict[int, int] = {}
        self.position = [0] * graph.num_ops
        for step, op in enumerate(schedule):
            self.position[op] = step
        self.fused = timeline.fused
        # _rebuild_peak's answers on this order (they depend on nothing else)
        self.rebuild_peaks: dict[tuple, int] = graph.memo(
            "_rebuild_peaks", dict, full=lambda memo: len(memo) >= _TRAJECTORIES_KEPT
        ).setdefault(tuple(schedule), {})
        self.born = [-1] * len(graph.values)
        for op, step in enumerate(self.position):
            for v in graph.ops[op].outputs:
                self.born[v] = step
        n = len(schedule)
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
        self.anchor = anchor_steps(graph, schedule)

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


def _drop_for(est: Estimate, v: int, peak: int, depth: int, chains: "_Chains"
              ) -> Drop | None:
    """How ``v`` would be dropped across ``peak``, or None if it cannot be.

    A sweep asks about the same value at the same peak step many times, so the
    answer is kept on ``chains`` while it holds: until a drop
    reads ``v`` (its list of ``est.readers`` grows) or the chain it used is
    forgotten. Nothing else it reads changes during a sweep (``v`` itself, once
    dropped, is not asked about again)."""
    key = (v, peak, depth)
    known = chains.drops.get(key)
    readers = est.readers.get(v, ())
    if known is not None:
        n_readers, chain_key, chain_entry, drop = known
        if n_readers == len(readers) and (
                chain_key is None or chains.known.get(chain_key) is chain_entry):
            return drop
    chain_key, chain_entry, drop = _work_out_drop(est, v, peak, depth, chains, readers)
    chains.drops[key] = (len(readers), chain_key, chain_entry, drop)
    return drop


def _work_out_drop(est: Estimate, v: int, peak: int, depth: int, chains: "_Chains",
                   readers: Sequence[int]
                   ) -> tuple[tuple | None, tuple | None, Drop | None]:
    """:func:`_drop_for`'s answer, worked out, after the key and entry in
    ``chains.known`` of the chain it looked up (None if none): the answer holds
    while that entry does."""
    graph = est.graph
    late: list[int] = []
    fused_early: list[int] = []
    early_end = est.born[v]
    stack, seen = [v], set()
    while stack:
        for u in graph.users[stack.pop()]:
            if u in seen:
                continue
            seen.add(u)
            if est.anchor[u] <= peak:
                early_end = max(early_end, est.anchor[u])
            elif est.position[u] > peak:
                late.append(u)
            else:                          # runs late only through fusion
                fused_early.append(u)
                stack.extend(graph.ops[u].outputs)
    extends = []
    for k in readers:
        if est.drops[k].first_late <= peak:
            early_end = max(early_end, est.drops[k].first_late)
        else:
            extends.append(k)
    if not late and not extends:
        return None, None, None
    first_late = min([est.position[u] for u in late] +
                     [est.drops[k].first_late for k in extends])
    roots = [graph.values[v].producer, *fused_early]
    chain_key = (tuple(roots), depth + len(fused_early), first_late)
    entry = chains.get(chain_key)
    chain, chain_cost = entry
    if chain is None:
        return chain_key, entry, None
    nbytes = graph.values[v].nbytes
    if est.joins(extends):
        # joins the one region that needs it: one rebuild, held for its readers
        return chain_key, entry, Drop(v, chain, tuple(sorted(late)), early_end,
                                      first_late, nbytes, chain_cost, tuple(extends),
                                      first_late)
    own = min((est.position[u] for u in late), default=None)
    cost = chain_cost * (len(extends) + (own is not None))
    freed_until = own if own is not None else est.dies[v] + 1
    region_step = own if own is not None else first_late
    return chain_key, entry, Drop(v, chain, tuple(sorted(late)), early_end,
                                  region_step, nbytes, cost, tuple(extends),
                                  freed_until)


def _with_transients(est: Estimate, d: Drop) -> Drop:
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


class _Chains:
    """The chains of one sweep: the ops recomputing some roots' outputs, at most
    ``depth`` of them, from values still live at step ``first_late`` (or program
    inputs), or None if the strategy allows no such chain; with its cost.

    A chain found once is reused until a value it starts from is dropped. Drops
    only ever end values earlier, so a chain that was not found stays not found.
    It also keeps :func:`_drop_for`'s answers (``drops``).
    """

    def __init__(self, est: Estimate, allowed: Sequence[bool], inputs: set[int]):
        self.est, self.allowed, self.inputs = est, allowed, inputs
        self.known: dict[tuple, tuple[tuple[int, ...] | None, float]] = {}
        self.starts: dict[int, list[tuple]] = {}   # value -> keys of chains reading it
        self.drops: dict[tuple, tuple] = {}        # _drop_for's answers

    def get(self, key: tuple) -> tuple[tuple[int, ...] | None, float]:
        """The chain of ``key`` (``(roots, depth, first_late)``) and its cost."""
        if key not in self.known:
            roots, depth, first_late = key
            chain, starts = self._find(roots, depth, first_late)
            graph = self.est.graph
            self.known[key] = (chain, sum(op_cost(graph, o) for o in chain or ()))
            for w in starts if chain is not None else ():
                self.starts.setdefault(w, []).append(key)
        return self.known[key]

    def dropped(self, value: int) -> None:
        """Forgets the chains that start from ``value``, now dropped."""
        for key in self.starts.pop(value, ()):
            self.known.pop(key, None)

    def _find(self, roots, depth, first_late):
        ops, values = self.est.graph.ops, self.est.graph.values
        allowed, dies, inputs = self.allowed, self.est.dies, self.inputs
        chain: list[int] = []
        starts: list[int] = []
        seen = set(roots)
        stack = list(roots)
        while stack:
            op = stack.pop()
            if not allowed[op]:
                return None, ()
            chain.append(op)
            if len(chain) > depth:
                return None, ()
            for w in ops[op].inputs:
                if w in inputs:
                    continue
                if dies[w] >= first_late:
                    starts.append(w)
                    continue
                p = values[w].producer
                if p is not None and p not in seen:
                    seen.add(p)
                    stack.append(p)
        return tuple(sorted(chain)), starts


@dataclasses.dataclass
class Trajectory:
    """The drops one strategy's sweep takes, in order, from the program as
    written (or as the phases before it left it, with nothing left to drop).

    Which drop a sweep takes next depends on the drops before it, never on the
    target, which only says when to stop; so a sweep for any target is a prefix of
    one trajectory, and the planners (re-aiming, attempts at other targets) replay
    it instead of sweeping again. ``peaks[k]`` is the estimated peak after the
    first ``k`` drops; ``depth`` the chain length reached; ``exhausted`` whether
    the sweep ended with nothing left to drop."""

    drops: list[Drop] = dataclasses.field(default_factory=list)
    peaks: list[int] = dataclasses.field(default_factory=list)
    depth: int = 1
    exhausted: bool = False


def sweep(est: Estimate, target: int, options: RematOptions, strategy: Strategy,
          trajectory: Trajectory | None = None) -> None:
    """Drops values at the estimated peak until it is within ``target``
    (recorded in ``est.drops``). With a ``trajectory`` whose drops ``est`` holds,
    goes on from its end and records what it adds."""
    graph = est.graph
    inputs, outputs = set(graph.inputs), set(graph.outputs)
    depth = strategy.start_depth if trajectory is None else trajectory.depth
    chains = _Chains(est, [strategy.allows(graph, o) for o in range(graph.num_ops)],
                     inputs)
    bounds = [0.0 if value.producer is None else
              value.nbytes / (op_cost(graph, value.producer) + 1.0)
              for value in graph.values]
    dropped = {d.value for d in est.drops}
    small = max(options.small_node_bytes, 1)
    eligible = np.array([v for v in range(len(graph.values))
                         if v not in inputs and v not in outputs and not est.fused[v]
                         and graph.values[v].nbytes >= small], dtype=np.int64)
    index = {int(v): k for k, v in enumerate(eligible)}
    born = np.array(est.born, dtype=np.int64)[eligible]
    dies = np.array(est.dies, dtype=np.int64)[eligible]
    gone = np.array([int(v) in dropped for v in eligible], dtype=bool)
    while True:
        peak_bytes, peak = est.peak()
        if trajectory is not None and len(trajectory.peaks) == len(trajectory.drops):
            trajectory.peaks.append(peak_bytes)
        if peak_bytes <= target:
            return
        live = eligible[(born < peak) & (peak <= dies) & ~gone].tolist()
        shortlist = _best_drops(est, live, peak, depth, chains, _SHORTLIST, bounds)
        chosen = _first_kept(est, shortlist, peak_bytes)
        if chosen is None:    # all rejected: work out every drop and try the rest
            tried = {d.value for d in shortlist}
            rest = _best_drops(est, [v for v in live if v not in tried], peak, depth,
                               chains, len(live), bounds)
            chosen = _first_kept(est, rest, peak_bytes)
        if chosen is not None:
            est.add(chosen)
            chains.dropped(chosen.value)
            k = index[chosen.value]
            dies[k], gone[k] = est.dies[chosen.value], True
            if trajectory is not None:
                trajectory.drops.append(chosen)
        else:
            if not strategy.grow or depth >= options.max_chain_ops:
                if trajectory is not None:
                    trajectory.exhausted = True
                return
            depth = min(2 * depth, options.max_chain_ops)
            if trajectory is not None:
                trajectory.depth = depth


def swept(graph: Graph, schedule: Sequence[int], baseline: Timeline,
          merge_segments: bool, target: int, options: RematOptions,
          phases: Sequence[Strategy]) -> Estimate:
    """A fresh estimate swept to ``target`` by each of ``phases`` in turn: the
    drops :func:`sweep` takes, replayed from the graph's :class:`Trajectory` of
    each phase as far as it goes, and swept on from its end. A phase starts only
    once the one before it has nothing left to drop (else the target is
    reached), so from the same state every time: its trajectory is kept per the
    phases before it too."""
    known = graph.memo("_trajectories", dict,
                       full=lambda memo: len(memo) >= _TRAJECTORIES_KEPT)
    est = Estimate(graph, schedule, baseline, merge_segments)
    for n, strategy in enumerate(phases):
        key = (tuple(schedule), tuple(phases[:n + 1]), merge_segments,
               options.small_node_bytes, options.max_chain_ops)
        trajectory = known.setdefault(key, Trajectory(depth=strategy.start_depth))
        for k, drop in enumerate(trajectory.drops):
            if trajectory.peaks[k] <= target:
                return est
            est.add(drop)
        if len(trajectory.peaks) > len(trajectory.drops) and trajectory.peaks[-1] <= target:
            return est
        if not trajectory.exhausted:
            sweep(est, target, options, strategy, trajectory)
            if not trajectory.exhausted:     # it stopped at the target
                return est
    est.exhausted = True
    return est


#: Trajectories a graph keeps (then it starts again): a few orders x strategies x
#: segment modes x small-node limits.
_TRAJECTORIES_KEPT = 64


#: Drops worked out in full per step before the rest are (see _best_drops).
_SHORTLIST = 6


def _first_kept(est: Estimate, drops: list[Drop], peak_bytes: int) -> Drop | None:
    """The first drop that does not raise the peak elsewhere."""
    for d in drops:
        d = _with_transients(est, d)
        est.apply(d)
        kept = est.peak()[0] <= peak_bytes
        est.apply(d, sign=-1)
        if kept:
            return d
    return None


def _best_drops(est: Estimate, live: list[int], peak: int, depth: int,
                chains: _Chains, count: int, bounds: Sequence[float]) -> list[Drop]:
    """The best ``count`` drops of ``live`` values across ``peak``, best first
    (ties: in visiting order).

    Working out a drop (its chain) is the expensive part, so values are visited
    in order of a score bound (``bounds``: bytes per cost of the producer alone,
    which a chain can only make worse) and the visit stops once the bound cannot
    beat the ``count`` best found.
    """
    kept: list[tuple[float, int, Drop]] = []    # a min-heap: the worst kept first
    for i, v in enumerate(sorted(live, key=bounds.__getitem__, reverse=True)):
        if len(kept) >= count and bounds[v] <= kept[0][0]:
            break
        d = _drop_for(est, v, peak, depth, chains)
        if d is not None and d.early_end < peak < d.freed_until:
            item = (d.score, -i, d)
            if len(kept) < count:
                heapq.heappush(kept, item)
            elif item[:2] > kept[0][:2]:
                heapq.heapreplace(kept, item)
    return [d for _, _, d in sorted(kept, key=lambda t: (-t[0], -t[1]))]


def best_of(results: Sequence[PlanResult]) -> PlanResult:
    """The cheapest plan that meets its limit, else the cheapest with the lowest peak."""
    met = [r for r in results if r.met]
    if met:
        return min(met, key=lambda r: r.extra_flops)
    return min(results, key=lambda r: (r.timeline.peak_bytes, r.extra_flops))


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


def run_greedy(graph: Graph, schedule: Sequence[int], options: RematOptions,
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
    baseline = simulate(graph, schedule)
    results = [r for merge in (False, True)
               if (r := _run(graph, schedule, options, phases, keep, baseline, merge))]
    if not results:   # no realizable plan: the program as written, limit not met
        rw, tl = evaluate(graph, schedule, [])
        return PlanResult((), rw, tl, baseline, options.model_target_bytes)
    best = best_of(results)
    if not best.met or not consolidate:
        return best
    return consolidated(graph, schedule, best, best.limit_bytes)


def cheapest_consolidated(graph: Graph, schedule: Sequence[int],
                          results: Sequence[PlanResult]) -> PlanResult:
    """:func:`best_of` ``results`` once each that meets its limit is
    :func:`consolidated` within it, consolidating only those that can still win.
    Merging regions leaves each op they recompute recomputed at least once, so
    a plan whose recomputed ops, each counted once, cost more than the cheapest
    consolidated plan so far cannot beat it, and is not consolidated (each merge
    trial simulates the whole program)."""
    met = [i for i, r in enumerate(results) if r.met]
    if not met:
        return best_of(results)
    ops = graph.ops

    def least_flops(result: PlanResult) -> float:
        recomputed = set().union(*(r.recompute for r in result.regions))
        return sum(ops[o].flops for o in recomputed)

    best, best_index = None, -1
    for bound, i in sorted((least_flops(results[i]), i) for i in met):
        if best is not None and bound * (1 - 1e-9) > best.extra_flops:
            continue
        merged = consolidated(graph, schedule, results[i], results[i].limit_bytes)
        # the first of equally cheap plans wins, as in best_of
        if best is None or (merged.extra_flops, i) < (best.extra_flops, best_index):
            best, best_index = merged, i
    return best


def consolidated(graph: Graph, schedule: Sequence[int], result: PlanResult,
                 within: int) -> PlanResult:
    """``result`` with its regions that rebuild the same ops merged while the
    simulated peak stays within ``within`` bytes (consolidate.py); the result
    keeps ``result``'s limit. Each try simulates the whole program, so big
    programs get fewer (a count, not a time budget: plans stay reproducible).
    A plan that missed its limit can be consolidated within its own peak: the
    same peak for less recompute."""
    _, simulated = merge_regions_simulated(
        graph, schedule, result.regions, within,
        max_trials=max(8, 20_000 // max(graph.num_ops, 1)),
        base=(result.rewritten, result.timeline))
    if simulated is None:     # no merge kept
        return result
    rw, tl = simulated
    return PlanResult(tuple(rw.regions), rw, tl, result.baseline, result.limit_bytes)


def _run(graph: Graph, schedule: Sequence[int], options: RematOptions,
         phases: Sequence[Strategy], keep, baseline: Timeline,
         merge_segments: bool) -> PlanResult | None:
    """One planning run: sweep with the estimate, simulate, re-aim if short.
    A plan whose regions cannot be realized (merged regions depending on each
    other in a cycle, or a rebuild reading a value its own block defines later)
    ends the run, which returns the best plan it had (None if it had none)."""
    limit = options.model_target_bytes
    best: PlanResult | None = None
    target = limit
    for _ in range(_REAIM):
        est = swept(graph, schedule, baseline, merge_segments, target, options, phases)
        drops = est.drops
        if keep is not None:
            drops = keep(est, target)
        try:
            rw, tl = evaluate(graph, schedule, est.regions(drops))
        except PlanError:
            break
        result = PlanResult(tuple(rw.regions), rw, tl, baseline, limit)
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

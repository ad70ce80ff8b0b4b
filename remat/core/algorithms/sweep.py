"""The greedy sweep: drop values at the estimated peak until it is within a target.

At each step the sweep looks at the values live at the estimated peak of an
:class:`~remat.core.algorithms.estimate.Estimate`; for each that is read again
after the peak, it finds the ops that would recompute it there from values still
live at that point (its *chain*, restricted by a :class:`Strategy`), and takes the
drop that frees the most bytes per unit of recompute cost
(``nbytes / (cost + 1)``) without raising the peak elsewhere. When no drop's
chain fits, chains may grow (doubling, up to ``options.max_chain_ops``), as XLA's
``HloRematerialization`` grows its block size.

Reuse within a sweep: a value's chain is worked out once and reused until a
value it starts from is dropped (``_Chains``); drops only end values earlier, so
a chain not found stays not found. A value's drop across a peak step is reused
until a drop reads the value or its chain is forgotten.

Reuse across sweeps: which value a sweep drops next never depends on its
target, only where it stops, so each graph on an order (its
:class:`~remat.core.scheduled.Scheduled`) keeps each phase's sweep (a
:class:`Trajectory`) and later sweeps, re-aimed or for another target, replay it
and go on from its end (:func:`swept`). Replaying gives the plan a fresh sweep
gives. A sweep under a small-node limit starts from a copy of the one under a
lower limit where that one dropped no value the higher limit rules out
(:func:`_shared`): the heuristics plan under none first, then under the default.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence

import numpy as np

from ..graph import Graph
from ..options import RematOptions
from ..scheduled import Scheduled
from .cost import op_cost
from .estimate import TRAJECTORIES_KEPT, Drop, Estimate, with_transients

__all__ = ["Strategy", "Trajectory", "sweep", "swept"]

#: Drops worked out in full per step before the rest are (see _best_drops).
_SHORTLIST = 6


@dataclasses.dataclass(frozen=True)
class Strategy:
    """How an algorithm restricts the greedy search.

    Attributes:
      allows: ``(graph, op_id) -> bool``: whether an op may be recomputed.
      start_depth: the longest chain to start with.
      grow: whether chains may grow up to ``options.max_chain_ops`` when stuck.
      banned: ops never recomputed, whatever ``allows`` says (an exchange's:
        :func:`~remat.core.algorithms.greedy.plan_exchanged`).
    """

    allows: Callable[[Graph, int], bool]
    start_depth: int = 1
    grow: bool = True
    banned: frozenset[int] = frozenset()


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
    first ``k`` drops; ``depth`` the chain length reached; ``grown`` how many
    drops were taken each time the chains grew; ``exhausted`` whether the sweep ended
    with nothing left to drop."""

    drops: list[Drop] = dataclasses.field(default_factory=list)
    peaks: list[int] = dataclasses.field(default_factory=list)
    depth: int = 1
    exhausted: bool = False
    grown: list[int] = dataclasses.field(default_factory=list)


def sweep(est: Estimate, target: int, options: RematOptions, strategy: Strategy,
          trajectory: Trajectory | None = None) -> None:
    """Drops values at the estimated peak until it is within ``target``
    (recorded in ``est.drops``). With a ``trajectory`` whose drops ``est`` holds,
    goes on from its end and records what it adds."""
    graph = est.graph
    inputs, outputs = set(graph.inputs), set(graph.outputs)
    depth = strategy.start_depth if trajectory is None else trajectory.depth
    chains = _Chains(est, [o not in strategy.banned and strategy.allows(graph, o)
                           for o in range(graph.num_ops)], inputs)
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
                trajectory.grown.append(len(trajectory.drops))


def swept(scheduled: Scheduled, merge_segments: bool, target: int,
          options: RematOptions, phases: Sequence[Strategy]) -> Estimate:
    """A fresh estimate swept to ``target`` by each of ``phases`` in turn: the
    drops :func:`sweep` takes, replayed from ``scheduled``'s :class:`Trajectory`
    of each phase as far as it goes, and swept on from its end. A phase starts
    only once the one before it has nothing left to drop (else the target is
    reached), so from the same state every time: its trajectory is kept per the
    phases before it too."""
    known = scheduled.caches.trajectories
    if len(known) >= TRAJECTORIES_KEPT:
        known.clear()
    est = Estimate(scheduled, merge_segments)
    for n, strategy in enumerate(phases):
        key = (tuple(phases[:n + 1]), merge_segments, options.small_node_bytes,
               options.max_chain_ops)
        if key not in known:
            known[key] = (_shared(known, key, scheduled.graph)
                          or _before_banned(known, key)
                          or Trajectory(depth=strategy.start_depth))
        trajectory = known[key]
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


def _shared(known: dict, key: tuple, graph: Graph) -> Trajectory | None:
    """A copy of the trajectory swept under a lower small-node limit, if it
    serves ``key``'s: where that sweep (and those of the phases before it, the
    same under both limits) dropped no value under ``key``'s limit, a sweep under
    ``key``'s limit takes the same drops. Each step takes the first drop, best
    first, that does not raise the peak elsewhere; the values a higher limit
    rules out were never taken, and ruling them out leaves the others' order."""
    phases, merge, small, max_chain = key
    for (other_phases, other_merge, other_small, other_chain), t in known.items():
        if (other_phases == phases and other_merge == merge and other_small < small
                and other_chain == max_chain
                and all(graph.values[d.value].nbytes >= small for d in t.drops)
                and all(known.get((phases[:m], merge, small, max_chain)) ==
                        known.get((phases[:m], merge, other_small, max_chain))
                        for m in range(1, len(phases)))):
            return Trajectory(list(t.drops), list(t.peaks), t.depth, t.exhausted,
                              list(t.grown))
    return None


def _before_banned(known: dict, key: tuple) -> Trajectory | None:
    """The longest prefix of a known single-phase trajectory that banned fewer
    ops, where it serves ``key``'s: up to its first drop whose chain holds an op
    ``key``'s strategy bans. Each step takes the first drop, best first, that
    does not raise the peak elsewhere; banning ops takes candidates away, never
    adds any, so the drop taken stays the first while it holds no banned op (and
    chains grow where they grew: no drop of fewer ops was found, with more
    candidates). None where no such trajectory serves more than its start."""
    phases, merge, small, chain_ops = key
    if len(phases) != 1 or not phases[0].banned:
        return None
    best: Trajectory | None = None
    for (other, other_merge, other_small, other_chain), t in known.items():
        if (len(other) != 1 or (other_merge, other_small, other_chain) != (
                merge, small, chain_ops) or not other[0].banned < phases[0].banned
                or dataclasses.replace(other[0], banned=phases[0].banned) != phases[0]):
            continue
        new = phases[0].banned - other[0].banned
        n = next((k for k, d in enumerate(t.drops) if new.intersection(d.chain)),
                 len(t.drops))
        if n and (best is None or n > len(best.drops)):
            grown = [c for c in t.grown if c < n]
            depth = min(phases[0].start_depth * 2 ** len(grown), chain_ops)
            best = Trajectory(list(t.drops[:n]), list(t.peaks[:n + 1]), depth,
                              t.exhausted and n == len(t.drops), grown)
    return best


def _first_kept(est: Estimate, drops: list[Drop], peak_bytes: int) -> Drop | None:
    """The first drop that does not raise the peak elsewhere."""
    for d in drops:
        d = with_transients(est, d)
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

"""The greedy engine the seed's algorithms share.

State: a list of regions (``remat.core.plan``). One step, in the spirit of XLA's
``HloRematerialization``: simulate the rewritten program, look at the values live
at its peak, and for each that is read again after the peak, find the ops that
would recompute it from values still live at that later point (its *chain*, at
most ``depth`` ops). Score a candidate by bytes freed per unit of recompute cost,
try the best ones, and keep the first that lowers the peak. When none does, allow
longer chains (XLA's growing block size). Stop when the peak is under the limit.

What differs between algorithms is which candidates are allowed and how long their
chains may grow; each algorithm module passes a :class:`Strategy`.

Cost of an op: ``flops + 10 * transcendentals`` (the weighting of the seed's
"path" algorithm). Every evaluation goes through :func:`remat.core.simulate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ..graph import Graph
from ..options import RematOptions
from ..plan import Region, Rewritten, apply_plan
from ..simulate import Timeline, simulate

__all__ = ["PlanResult", "Strategy", "Candidate", "run_greedy", "op_cost", "evaluate"]

#: Candidates simulated per step before the chain length grows.
_TRIES_PER_STEP = 8


def op_cost(graph: Graph, op_id: int) -> float:
    op = graph.ops[op_id]
    return op.flops + 10.0 * op.transcendentals


@dataclasses.dataclass(frozen=True)
class PlanResult:
    """What an algorithm chose, and the rewritten program it gives.

    Attributes:
      regions: the recomputation regions (original op ids).
      rewritten: the rewritten program and its schedule.
      timeline: the simulation of ``rewritten``.
      baseline: the simulation of the original program.
      limit_bytes: the limit planned for.
    """

    regions: tuple[Region, ...]
    rewritten: Rewritten
    timeline: Timeline
    baseline: Timeline
    limit_bytes: int

    @property
    def met(self) -> bool:
        return self.timeline.peak_bytes <= self.limit_bytes

    @property
    def extra_flops(self) -> float:
        return self.rewritten.extra_flops


@dataclasses.dataclass(frozen=True)
class Candidate:
    value: int                  # original value id
    chain: tuple[int, ...]      # original op ids to recompute
    consumers: tuple[int, ...]  # original ops (outside copies) that read it late
    into_regions: tuple[int, ...]  # regions whose copies read it late
    nbytes: int
    cost: float

    @property
    def score(self) -> float:
        return self.nbytes / (self.cost + 1.0)


@dataclasses.dataclass(frozen=True)
class Strategy:
    """How an algorithm restricts the greedy search.

    Attributes:
      allows: ``(graph, op_id) -> bool``: whether an op may be recomputed.
      start_depth: the chain length to start with.
      grow: whether chains may grow up to ``options.max_chain_ops`` when stuck.
    """

    allows: Callable[[Graph, int], bool]
    start_depth: int = 1
    grow: bool = True


def evaluate(graph: Graph, schedule: Sequence[int],
             regions: Sequence[Region]) -> tuple[Rewritten, Timeline]:
    rewritten = apply_plan(graph, schedule, regions)
    return rewritten, simulate(rewritten.graph, rewritten.schedule, check=False)


def _candidates(graph: Graph, rw: Rewritten, tl: Timeline, options: RematOptions,
                strategy: Strategy, depth: int, rejected: set[int]) -> list[Candidate]:
    g2 = rw.graph
    peak = tl.peak_step
    inputs = set(graph.inputs)
    outputs = set(graph.outputs)
    born = [-1] * len(g2.values)
    for step, op in enumerate(rw.schedule):
        for v in g2.ops[op].outputs:
            born[v] = step

    def live_at(v2: int, step: int) -> bool:
        if g2.values[v2].producer is None:
            return True
        dies = tl.last_use_step[v2]
        return born[v2] <= step and (dies == -1 or dies >= step)

    instance_value = {}
    for v2, v in enumerate(rw.value_origin):
        p2 = g2.values[v2].producer
        if p2 is None or not rw.is_copy[p2]:
            instance_value[v] = v2

    anchor = _anchors(g2, tl)
    found = []
    for v2 in range(len(g2.values)):
        v = rw.value_origin[v2]
        p2 = g2.values[v2].producer
        if (p2 is None or rw.is_copy[p2] or v in rejected or v in inputs or
                v in outputs or tl.fused[v2] or g2.values[v2].nbytes <
                options.small_node_bytes or not live_at(v2, peak) or born[v2] >= peak):
            continue
        late, fused_late = _late_uses(g2, tl, anchor, v2, peak)
        if not late or any(rw.is_copy[u] for u in fused_late):
            continue
        when = min(late)
        roots = [graph.values[v].producer] + [rw.origin[u] for u in fused_late]
        chain = _chain(graph, roots, depth + len(fused_late), strategy,
                       lambda w: w in inputs or live_at(instance_value[w], when))
        if chain is None:
            continue
        consumers = tuple(sorted({rw.origin[u] for u in late if not rw.is_copy[u]}))
        into = tuple(sorted({rw.region[u] for u in late if rw.is_copy[u]}))
        found.append(Candidate(v, chain, consumers, into, g2.values[v2].nbytes,
                               sum(op_cost(graph, o) for o in chain)))
    found.sort(key=lambda c: -c.score)
    return found


def _anchors(graph: Graph, tl: Timeline) -> list[int]:
    """The step at which each op really runs: a fused op runs with the op that
    consumes its fused chain (as the simulator models it)."""
    anchor = list(range(len(graph.ops)))       # the rewritten schedule is 0..n-1
    for op in range(len(graph.ops) - 1, -1, -1):
        outs = graph.ops[op].outputs
        if outs and all(tl.fused[v] for v in outs):
            anchor[op] = max(anchor[u] for v in outs for u in graph.users[v])
    return anchor


def _late_uses(graph: Graph, tl: Timeline, anchor: list[int], value: int,
               peak: int) -> tuple[list[int], list[int]]:
    """Ops reading ``value`` after ``peak``: the readers scheduled after it, and
    the early ops whose fused chains run after it (to be recomputed with the
    value, since fusion would otherwise keep the value live until then)."""
    late: list[int] = []
    fused: list[int] = []
    stack = [value]
    seen: set[int] = set()
    while stack:
        for u in graph.users[stack.pop()]:
            if u in seen or anchor[u] <= peak:
                continue
            seen.add(u)
            if u > peak:          # scheduled late: a consumer (the schedule is 0..n-1)
                late.append(u)
            else:                 # scheduled early, fused into a late consumer
                fused.append(u)
                stack.extend(graph.ops[u].outputs)
    return late, fused


def _chain(graph: Graph, roots: Sequence[int], depth: int, strategy: Strategy,
           available: Callable[[int], bool]) -> tuple[int, ...] | None:
    """Ops recomputing the roots' outputs from available values, or None."""
    chain: list[int] = []
    seen = set(roots)
    stack = list(roots)
    while stack:
        op = stack.pop()
        if not strategy.allows(graph, op):
            return None
        chain.append(op)
        if len(chain) > depth:
            return None
        for w in graph.ops[op].inputs:
            if available(w):
                continue
            p = graph.values[w].producer
            if p is None:
                continue
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return tuple(sorted(chain))


def _with(regions: list[Region], c: Candidate) -> list[Region]:
    new = list(regions)
    for k in c.into_regions:
        r = new[k]
        new[k] = Region(tuple(sorted(set(r.recompute) | set(c.chain))), r.consumers)
    if c.consumers:
        new.append(Region(c.chain, c.consumers))
    return new


def _better(old: Timeline, new: Timeline) -> bool:
    if new.peak_bytes != old.peak_bytes:
        return new.peak_bytes < old.peak_bytes
    return sum(new.live_during_bytes) < sum(old.live_during_bytes)


def run_greedy(graph: Graph, schedule: Sequence[int], options: RematOptions,
               strategy: Strategy, regions: Sequence[Region] = ()) -> PlanResult:
    """Adds regions to ``regions`` until the simulated peak is within the limit or
    nothing more helps; returns the best plan found."""
    limit = options.memory_limit_bytes
    baseline = simulate(graph, schedule)
    regions = list(regions)
    rw, tl = evaluate(graph, schedule, regions)
    depth = strategy.start_depth
    rejected: set[int] = set()
    while tl.peak_bytes > limit:
        candidates = _candidates(graph, rw, tl, options, strategy, depth, rejected)
        accepted = False
        for c in candidates[:_TRIES_PER_STEP]:
            trial = _with(regions, c)
            rw2, tl2 = evaluate(graph, schedule, trial)
            if _better(tl, tl2):
                regions, rw, tl = list(rw2.regions), rw2, tl2
                rejected.clear()
                accepted = True
                break
            rejected.add(c.value)
        if accepted or candidates[_TRIES_PER_STEP:]:
            continue
        if not strategy.grow or depth >= options.max_chain_ops:
            break
        depth = min(2 * depth, options.max_chain_ops)
        rejected.clear()
    return PlanResult(tuple(regions), rw, tl, baseline, limit)

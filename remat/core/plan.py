"""Plans: which values to recompute, grouped into regions, and the program they give.

A *region* says: run these ops again (``recompute``, original op ids) and let these
later ops (``consumers``) read the copies instead of the originals. The originals
then die after their last remaining (early) reader, which is where memory is saved.

Why regions and not single values: a compiler undoes recomputation that is not
fenced off. Scheduling runs it early (it only depends on old values) and CSE merges
it with the original. The adapter therefore emits each region as one opaque block
(the JAX adapter: a ``remat_p`` equation lowered as a conditional) holding the
recomputation *and* every consumer, fed by the consumers' other operands (the
cotangents, in a backward pass). A block must be *convex*: no path may leave it and
come back, or it could not run as one step. So a region's block is the convex hull
of its consumers (every op on a path between two of them), plus the copies.

The compiler cannot fuse across a block's edge either: a block's results are in
memory (a conditional's results). So a consumer that would fuse into a later op
brings that op into its block, else the block would hand out its unfused results
in memory: one buffer per block that the model, which fuses them, does not count.

:func:`apply_plan` builds the rewritten program as a plain :class:`Graph` with a
schedule, so the one simulator measures every plan the same way
(:func:`remat.core.evaluate.evaluate` does both). It plans on a
:class:`~remat.core.scheduled.Scheduled` (the graph on its original order), where
the blocks of the regions seen are kept for the next plan.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> from remat.core.scheduled import on_schedule
    >>> b = GraphBuilder()
    >>> x = b.add_input(8)
    >>> (a,) = b.add_op("f", [x], [100])
    >>> (y,) = b.add_op("g", [a], [8])
    >>> (z,) = b.add_op("h", [y, a], [8])
    >>> g = b.build(outputs=[z])
    >>> r = apply_plan(on_schedule(g, (0, 1, 2)), [Region(recompute=(0,), consumers=(2,))])
    >>> [(g.ops[r.origin[o]].label, r.is_copy[o]) for o in r.schedule]
    [('f', False), ('g', False), ('f', True), ('h', False)]
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Sequence

from .fusion import fused_values
from .graph import Graph, Op, Value
from .scheduled import Scheduled

__all__ = ["Region", "Rewritten", "PlanError", "apply_plan", "convex_hull"]


class PlanError(ValueError):
    """A plan cannot be realized (its blocks would form a cycle, an op is unknown)."""


@dataclasses.dataclass(frozen=True)
class Region:
    """Recompute ``recompute`` (original op ids) for the ops in ``consumers``."""

    recompute: tuple[int, ...]
    consumers: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Rewritten:
    """A plan applied to a graph.

    Attributes:
      graph: the rewritten program: the original ops and values under their own
        ids, consumers rewired to the copies, then one copy of each recomputed
        op per region (and its values), appended.
      schedule: its op ids in running order; each region's block is contiguous.
      origin: for each op of ``graph``, the original op id it runs.
      is_copy: for each op of ``graph``, whether it is a recomputation.
      region: for each op of ``graph``, the index of the region whose block it is
        in, or -1.
      blocks: for each region, the ops of ``graph`` in its block, in running order.
      value_origin: for each value of ``graph``, the original value id it holds.
      regions: the regions after merging those whose blocks overlapped.
    """

    graph: Graph
    schedule: tuple[int, ...]
    origin: tuple[int, ...]
    is_copy: tuple[bool, ...]
    region: tuple[int, ...]
    blocks: tuple[tuple[int, ...], ...]
    value_origin: tuple[int, ...]
    regions: tuple[Region, ...]

    @property
    def extra_flops(self) -> float:
        """FLOPs of the recomputations."""
        ops = self.graph.ops
        return sum(ops[o].flops for o, c in enumerate(self.is_copy) if c)


def convex_hull(graph: Graph, ops: Sequence[int],
                position: Sequence[int] | None = None) -> set[int]:
    """``ops`` plus every op on a path between two of them.

    ``position`` (each op's step in a topological order), if given, bounds the
    search: an op between two others runs between them in any such order.
    """
    seeds = set(ops)
    if not seeds:
        return seeds
    if position is None:
        inside = None
    else:
        lo = min(position[o] for o in seeds)
        hi = max(position[o] for o in seeds)
        inside = lambda o: lo <= position[o] <= hi
    below = _reach(seeds, graph.successors, inside)
    above = _reach(seeds, graph.predecessors, inside)
    return (below & above) | seeds


def _reach(seeds: set[int], edges, inside=None) -> set[int]:
    seen = set(seeds)
    stack = list(seeds)
    while stack:
        for nxt in edges[stack.pop()]:
            if nxt not in seen and (inside is None or inside(nxt)):
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _merge_overlapping(graph: Graph, regions: Sequence[Region], position,
                       blocks: dict[Region, tuple[Region, frozenset[int]]]):
    """Regions whose blocks would overlap are merged into one (placed where the
    last of them was), until no two blocks overlap. ``blocks`` keeps each
    region's consumers with their fusions and its block (read-only sets)."""
    # recompute, consumers and block (hull) of each merged region
    merged: dict[int, tuple[set[int], set[int], set[int]]] = {}
    owner: dict[int, int] = {}      # op -> the merged region whose block holds it
    for key, region in enumerate(regions):
        known = blocks.get(region)
        if known is None:
            fused = _with_fusions(graph, region, position)
            known = blocks[region] = fused, frozenset(
                convex_hull(graph, fused.consumers, position))
        r, hull = known
        rec, cons = set(r.recompute), set(r.consumers)
        while overlapped := {owner[o] for o in hull if o in owner}:
            for k in overlapped:
                orec, ocons, ohull = merged.pop(k)
                rec |= orec
                cons |= ocons
                for o in ohull:
                    del owner[o]
            hull = convex_hull(graph, cons, position)
        merged[key] = (rec, cons, hull)
        owner.update(dict.fromkeys(hull, key))
    return list(merged.values())


def apply_plan(scheduled: Scheduled, regions: Sequence[Region]) -> Rewritten:
    """Rewrites ``scheduled.graph`` so each region's consumers read recomputed
    copies.

    ``scheduled.schedule`` is the original running order; the new one keeps it
    wherever the blocks allow (a priority topological sort on original positions).
    """
    graph, schedule, position = scheduled.graph, scheduled.schedule, scheduled.position
    n = len(graph.ops)
    merged = _merge_overlapping(graph, regions, position, _blocks_known(scheduled))
    for k, (rec, _, _) in enumerate(merged):
        if any(not 0 <= o < n for o in rec):
            raise PlanError(f"region {k} recomputes an op id outside 0..{n - 1}.")

    # The rewritten graph keeps every original op and value under its own id (an
    # op outside the blocks is the same object), and appends the copies: a plan
    # touches a few ops of a big program, and every planner checks many plans.
    values = list(graph.values)
    ops = list(graph.ops)
    origin = list(range(n))
    is_copy = [False] * n
    region_of = [-1] * n
    value_origin = list(range(len(values)))
    done = [False] * n          # originals emitted so far
    producer = [v.producer for v in graph.values]
    schedule_out: list[int] = []
    changed: list[int] = []
    blocks: list[tuple[int, ...]] = [()] * len(merged)

    def renamed(op_id: int, rename: dict[int, int]) -> tuple[int, ...]:
        ins = []
        for v in graph.ops[op_id].inputs:
            if v in rename:
                ins.append(rename[v])
                continue
            p = producer[v]
            if p is not None and not done[p]:
                raise PlanError(
                    f"op {op_id} ({graph.ops[op_id].label}) would read a value its "
                    "own region defines later: a region cannot recompute from its "
                    "own consumers' results.")
            ins.append(v)
        return tuple(ins)

    for unit in _unit_order(graph, schedule, position, merged):
        if unit >= 0:
            done[unit] = True
            schedule_out.append(unit)
            continue
        k = -unit - 1
        rec, _, hull = merged[k]
        rename: dict[int, int] = {}
        start = len(schedule_out)
        for o in sorted(rec, key=position.__getitem__):
            op = graph.ops[o]
            ins = renamed(o, rename)
            copy = len(ops)
            outs = tuple(range(len(values), len(values) + len(op.outputs)))
            for old, new in zip(op.outputs, outs):
                v = graph.values[old]
                values.append(Value(v.nbytes, copy, v.shape))
                value_origin.append(old)
                rename[old] = new
            ops.append(Op(op.label, ins, outs, op.flops, op.transcendentals, op.source,
                          op.fusion, op.working_set_bytes, op.repeatable))
            origin.append(o)
            is_copy.append(True)
            region_of.append(k)
            schedule_out.append(copy)
            changed.append(copy)
        for o in sorted(hull, key=position.__getitem__):
            ins = renamed(o, rename)
            if ins != graph.ops[o].inputs:
                ops[o] = graph.ops[o]._replace(inputs=ins)
                changed.append(o)
            done[o] = True
            region_of[o] = k
            schedule_out.append(o)
        blocks[k] = tuple(schedule_out[start:])

    new_graph = Graph.rewired(graph, tuple(values), tuple(ops), changed,
                              tuple(schedule_out))
    final_regions = tuple(Region(tuple(sorted(rec)), tuple(sorted(cons)))
                          for rec, cons, _ in merged)
    return Rewritten(new_graph, tuple(schedule_out), tuple(origin), tuple(is_copy),
                     tuple(region_of), tuple(blocks), tuple(value_origin),
                     final_regions)


#: Regions whose blocks a :class:`Scheduled` keeps (then it starts again).
_BLOCKS_KEPT = 16384


def _blocks_known(scheduled: Scheduled) -> dict[Region, tuple[Region, frozenset[int]]]:
    """Each region's consumers with their fusions and its block, on
    ``scheduled``, as worked out so far: a planner's trials share the schedule
    and most of their regions (merging tries one pair at a time)."""
    blocks = scheduled.caches.blocks
    if len(blocks) >= _BLOCKS_KEPT:
        blocks.clear()
    return blocks


def _with_fusions(graph: Graph, region: Region, position) -> Region:
    """``region`` with the whole fusion of each consumer: a consumer whose results
    a fusing compiler keeps in registers runs inside the op that reads them, so
    that op joins the block too (else the block would hand out the unfused
    results, in memory). So does a *follower*: the only reader of a consumer's
    result that reads nothing else and writes no more bytes (a transpose, a
    reshape, a narrowing cast); outside the block, the compiler could not fold
    it into the op making its input (a dot writes its result transposed, into a
    gradient's own buffer), and would hold the block's result and its own at
    once. Only elementwise ops join, and only when no other fused value would
    be handed in and the block would span no other ops: a reduction, or an op
    reading fused values from outside, pulled into a block makes the compiler
    materialize inputs the model counts as fused, so the compiled program would
    hold more than the plan simulated."""
    fused = fused_values(graph)
    outputs = frozenset(graph.outputs)
    consumers = set(region.consumers)
    stack = list(consumers)
    while stack:
        op = graph.ops[stack.pop()]
        for v in op.outputs:
            if fused[v] or _read_by_a_follower(graph, v, outputs):
                for u in graph.users[v]:
                    if u not in consumers:
                        consumers.add(u)
                        stack.append(u)
    if len(consumers) == len(region.consumers):
        return region
    added = consumers.difference(region.consumers)
    # Nor when an added op is a reduction, fuses other values made outside the
    # block (they would be handed in, in memory), or the block would span other ops.
    if any(graph.ops[u].fusion not in ("loop", "copied") or any(
            fused[w] and graph.values[w].producer not in consumers
            for w in graph.ops[u].inputs) for u in added):
        return region
    if convex_hull(graph, consumers, position) - added != convex_hull(
            graph, region.consumers, position):
        return region
    return Region(region.recompute, tuple(sorted(consumers)))


def _read_by_a_follower(graph: Graph, v: int, outputs: frozenset[int]) -> bool:
    """Whether ``v``'s only reader is elementwise or data movement, reads
    nothing else and writes no more bytes than ``v`` has (a program output, one
    of ``outputs``, is handed out whatever reads it)."""
    readers = graph.users[v]
    if len(readers) != 1 or v in outputs:
        return False
    op = graph.ops[readers[0]]
    return (op.fusion in ("loop", "copied") and all(w == v for w in op.inputs)
            and sum(graph.values[w].nbytes for w in op.outputs) <= graph.values[v].nbytes)


def _frees(graph: Graph, op_id: int, outputs: frozenset[int]) -> bool:
    """Whether an op frees at least the bytes it takes: the temporaries it alone
    reads against its results that are no program outputs (those have buffers
    of their own from the start)."""
    op = graph.ops[op_id]
    freed = sum(graph.values[v].nbytes for v in set(op.inputs)
                if graph.values[v].producer is not None and v not in outputs
                and all(u == op_id for u in graph.users[v]))
    return freed > 0 and freed >= sum(graph.values[v].nbytes for v in op.outputs
                                      if v not in outputs)


def _unit_order(graph: Graph, schedule: Sequence[int], position, merged
                ) -> list[int]:
    """Topological order of units: ops outside blocks (as op ids) and blocks (as
    ``-1 - k``), earliest original position first; an op that reads from a block
    and frees at least what it takes (:func:`_frees`) ranks as the earliest
    block it reads from (it runs once its operands are ready, not where the
    original order put it: a plan moves what it reads earlier).

    Most ops neither are in a block nor read from one: their dependencies are
    their predecessors, as in the graph. Only blocks and the ops reading from
    them get dependency sets (a block also waits for what its copies read).
    The ops before the first block's first op run as in ``schedule``: none
    depends on a block, and each is ready when its turn comes."""
    n = len(graph.ops)
    if not merged:
        return list(schedule)
    predecessors, successors = graph.predecessors, graph.successors
    # unit ids: an op outside blocks is itself; block k is n + k
    unit = list(range(n))
    first = list(position) + [n] * len(merged)
    special = [False] * (n + len(merged))  # units with dependency sets
    for k, (_, _, hull) in enumerate(merged):
        special[n + k] = True
        first[n + k] = min(map(position.__getitem__, hull))
        for o in hull:
            unit[o] = n + k
    start = min(first[n:])
    deps: dict[int, set[int]] = {}
    frees: dict[int, bool] = {}
    outputs = frozenset(graph.outputs)
    for k, (rec, _, hull) in enumerate(merged):
        u = n + k
        d = deps[u] = set()
        for o in hull:
            for p in predecessors[o]:
                if unit[p] != u:
                    d.add(unit[p])
        for o in rec:           # copies read the originals' inputs
            for p in predecessors[o]:
                if p not in rec and unit[p] != u:
                    d.add(unit[p])
        for o in hull:
            for s in successors[o]:
                if unit[s] == s and not special[s]:     # reads from the block
                    special[s] = True
                    deps[s] = {unit[p] for p in predecessors[s]}
                    frees[s] = _frees(graph, s, outputs)
                if frees.get(s):    # (a weight gradient's transpose): run it early
                    first[s] = min(first[s], first[n + k])
    # what is left to run once the ops before ``start`` have: units still to wait for
    indegree = [0] * len(special)
    waiting: list[list[int]] = [[] for _ in special]     # specials waiting on a unit
    for u, d in deps.items():
        for p in d:
            if p >= n or position[p] >= start:
                indegree[u] += 1
                waiting[p].append(u)
    ready = []
    for step in range(start, n):
        o = schedule[step]
        if not special[unit[o]]:
            indegree[o] = left = sum(position[p] >= start for p in predecessors[o])
            if not left:
                ready.append((step, o))
    ready += [(first[u], u) for u in deps if not indegree[u]]
    heapq.heapify(ready)
    order = list(schedule[:start])
    while ready:
        _, u = heapq.heappop(ready)
        if u < n:
            order.append(u)
            for w in successors[u]:
                if not special[unit[w]]:
                    indegree[w] -= 1
                    if indegree[w] == 0:
                        heapq.heappush(ready, (first[w], w))
        else:
            order.append(n - 1 - u)
        for w in waiting[u]:
            indegree[w] -= 1
            if indegree[w] == 0:
                heapq.heappush(ready, (first[w], w))
    if len(order) != n - sum(len(hull) for _, _, hull in merged) + len(merged):
        raise PlanError("the plan's regions depend on each other in a cycle (a region "
                        "recomputes from values that its own consumers produce); "
                        "recompute from earlier values.")
    return order

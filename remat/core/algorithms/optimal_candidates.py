"""The candidates of ``"optimal"``: every way this planner knows to drop a value.

Over a given schedule, a candidate ``c`` is one :class:`~remat.core.plan.Region`,
fixed by:

* a value ``v`` (at least ``small_node_bytes``, not an input or output, not fused),
* a gap between two consecutive readers of ``v``: the readers up to the gap keep
  the original, the later ones (from step ``t``, the first of them) read a copy,
* a depth ``k``: the copy is rebuilt at ``t`` by a chain of ops that recomputes
  ``v`` back through ``k - 1`` values still live at ``t`` (depth 1 stops at the
  first live values, as the greedy engine does; deeper chains recompute a whole
  stretch from an earlier checkpoint, as a segment of a checkpointed chain does),
* optionally an end ``z`` (``upto``): the copy serves only the readers up to step
  ``z``, and another selected candidate of ``v`` from ``z`` on serves the rest. So
  a value can be rebuilt once per reader: a chain's activation, read by two
  backward ops with a large cotangent computed between them, rebuilt from the
  input for each (what a chain needs below one saved activation, as Revolve
  does with no free checkpoint).

Selecting ``c`` frees each value ``w`` its chain rebuilds and that lived across
``t`` (the set ``V(c)``) between its last early reader and ``t``; at ``t`` the
chain's other results are held for a moment on top (and what the block's own
ops read that would have been freed before the block can run: the block waits,
``ready``, for every op outside it whose results it reads). Its cost is the
chain's ``flops + 10 * transcendentals`` (as the greedy engine counts).

The graph is not coarsened: values under ``small_node_bytes`` and fused values
are never candidates, which is what keeps the integer program small. A chain
holds only recomputable ops, at most ``options.max_chain_ops`` of them, and its
depth is at most ``MAX_DEPTH``. Each region of ``seeds`` (the heuristics' plans)
is a candidate too. A depth-1 candidate that frees one value ``w`` also comes
freeing ``w`` only from each later step at which another candidate's chain reads
it. Candidates with the same step, chain, freed stretches and end are kept once.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Sequence

from ..graph import Graph
from ..options import RematOptions
from ..plan import Region, convex_hull
from ..scheduled import Scheduled
from .cost import op_cost
from .recomputable import recomputable

__all__ = ["Candidate", "candidates", "MAX_DEPTH"]

#: The deepest chain tried for one drop (in live values passed through).
MAX_DEPTH = 24


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to drop a value (see the module docstring).

    Attributes:
      value: the value the candidate was made for.
      t: the step of the first reader of the copy (where the chain runs).
      chain: the ops recomputed, original ids, sorted.
      consumers: the ops reading the copies (every reader at step ``t`` or later).
      freed: ``(w, early_end, nbytes)`` for each value of ``V``: it is out of
        memory after step ``early_end`` until ``t``.
      roots: the values the chain reads that it does not rebuild.
      transient: bytes the chain holds while it runs, on top of what is live
        then (the rebuilt ``V`` and the chain's other results).
      ready: the step after which the rebuild really runs: its block waits for
        every op outside it whose results the block reads (at least ``t - 1``).
      cost: recompute cost of the chain.
      upto: for a copy that serves only the readers of ``value`` up to this step
        (anchors), the step from which another selected candidate must serve the
        rest; None when the copy serves every later reader.
    """

    value: int
    t: int
    chain: tuple[int, ...]
    consumers: tuple[int, ...]
    freed: tuple[tuple[int, int, int], ...]
    roots: tuple[int, ...]
    transient: int
    cost: float
    ready: int = -1
    upto: int | None = None


def candidates(scheduled: Scheduled, options: RematOptions,
               seeds: Sequence[Region] = ()) -> list[Candidate]:
    """Every candidate drop of ``scheduled.graph`` over its schedule (see the
    module docstring), and one per region of ``seeds``.

    >>> from remat.core.graph import GraphBuilder
    >>> from remat.core.scheduled import on_schedule
    >>> b = GraphBuilder()
    >>> x = b.add_input(10)
    >>> a, = b.add_op("f", [x], [100])
    >>> a2, = b.add_op("f", [a], [100])
    >>> y, = b.add_op("g", [a2], [10])
    >>> z, = b.add_op("h", [y, a], [10])
    >>> s = on_schedule(b.build([z]), (0, 1, 2, 3))
    >>> [(c.value, c.t, c.chain) for c in candidates(
    ...     s, RematOptions(0, "optimal", small_node_bytes=0))]
    [(1, 3, (0,))]
    """
    graph, timeline = scheduled.graph, scheduled.timeline
    values, ops, users = graph.values, graph.ops, graph.users
    fused = timeline.fused
    anchor, position = scheduled.anchor, scheduled.position
    dies = timeline.last_use_step          # -1: never freed (inputs, outputs)
    inputs, outputs = set(graph.inputs), set(graph.outputs)
    resident = [0 if fused[v] else values[v].nbytes for v in range(len(values))]
    small = max(options.small_node_bytes, 1)

    def available(w: int, t: int) -> bool:
        if fused[w]:
            return False
        if w in outputs or (w in inputs and w not in graph.donated):
            return True
        return dies[w] >= t

    def chain_for(v: int, t: int, depth: int, extra: list[int], segment: bool
                  ) -> tuple[set[int], set[int]] | None:
        level: dict[int, int] = {}
        queue = deque([(values[v].producer, 0)] + [(u, 0) for u in extra])
        roots: set[int] = set()
        while queue:
            while queue:
                op, lvl = queue.popleft()
                if op in level and level[op] <= lvl:
                    continue
                if not recomputable(graph, op):
                    return None
                level[op] = lvl
                if len(level) > options.max_chain_ops:
                    return None
                for w in ops[op].inputs:
                    p = values[w].producer
                    if available(w, t):
                        if p is not None and lvl + 1 < depth and recomputable(graph, p):
                            queue.append((p, lvl + 1))
                        else:
                            roots.add(w)
                    elif p is None:
                        return None             # a donated input already gone
                    else:
                        queue.appendleft((p, lvl))
            # A rebuilt value is freed only if no reader holds it past t: a fused
            # reader scheduled early that runs late (inside a later fusion) is
            # recomputed too.
            for op in list(level) if segment else ():
                for w in ops[op].outputs:
                    for u in users[w]:
                        if (u not in level and position[u] < t <= anchor[u]
                                and recomputable(graph, u)):
                            queue.append((u, level[op]))
        chain = set(level)
        roots = {w for w in roots if values[w].producer not in chain}
        return chain, roots

    found: list[Candidate] = []
    shallow: set[int] = set()       # the depth-1 candidates
    seen: set[tuple] = set()
    for v, value in enumerate(values):
        if (value.producer is None or v in outputs or fused[v] or resident[v] < small
                or dies[v] < 0 or not recomputable(graph, value.producer)):
            continue
        born = anchor[value.producer]
        times = sorted({anchor[u] for u in users[v]})
        for a, b in zip([born] + times, times):
            # Readers from anchor b on read the copy. A fused reader that is
            # scheduled before b (it runs late, inside its consumer's fusion) is
            # recomputed too, so that its consumers read it from the copy.
            late, fused_early = [], []
            stack, visited = [v], set()
            while stack:
                for u in users[stack.pop()]:
                    if u in visited:
                        continue
                    visited.add(u)
                    if anchor[u] <= a:
                        continue
                    if position[u] > a:
                        late.append(u)
                    else:
                        fused_early.append(u)
                        stack.extend(ops[u].outputs)
            if not late:
                continue
            t = min(position[u] for u in late)
            if t <= a + 1:
                continue                    # nothing would be freed
            own = {v}.union(*(ops[u].outputs for u in fused_early))
            # A copy may also serve only the readers up to a later reader's step,
            # leaving the rest to another copy rebuilt later.
            ends = [None] + [z for z in times if b <= z < times[-1]]
            for segment in (True, False):
                previous = None
                for depth in range(1, MAX_DEPTH + 1):
                    got = chain_for(v, t, depth, fused_early, segment)
                    if got is None or got[0] == previous:
                        break
                    previous = got[0]
                    for upto in ends if not segment else [None]:
                        c = _candidate(graph, v, t, got[0], got[1], position, anchor,
                                       available, resident, inputs, outputs,
                                       None if segment else own, upto=upto)
                        key = (c.t, c.chain, c.freed, c.upto)
                        if c.freed and key not in seen:
                            seen.add(key)
                            if depth == 1 and upto is None:
                                shallow.add(len(found))
                            found.append(c)
    # The regions of the heuristics' plans, as candidates: under the estimate,
    # the optimum is then never worse than theirs.
    for region in seeds:
        if not region.consumers:
            continue
        chain = set(region.recompute)
        t = min(position[u] for u in region.consumers)
        roots = {w for o in chain for w in ops[o].inputs
                 if values[w].producer not in chain}
        if any(not available(w, t) and values[w].producer is None for w in roots):
            continue
        c = _candidate(graph, region.recompute[0], t, chain, roots, position, anchor,
                       available, resident, inputs, outputs, None,
                       served=set(region.consumers))
        key = (c.t, c.chain, c.freed, c.upto)
        if c.freed and key not in seen:
            seen.add(key)
            found.append(c)
    # A value another chain reads at step s can still be freed, from s on: add
    # those later starts to the depth-1 candidates that free one value.
    read_at: dict[int, set[int]] = {}
    for c in found:
        for r in c.roots:
            read_at.setdefault(r, set()).add(c.t)
    for c in [found[i] for i in sorted(shallow)]:
        if len(c.freed) != 1:
            continue
        for k, (w, e, nbytes) in enumerate(c.freed):
            for s in sorted(read_at.get(w, ())):
                if e < s < c.t - 1:
                    freed = tuple(sorted(c.freed[:k] + ((w, s, nbytes),) + c.freed[k + 1:]))
                    key = (c.t, c.chain, freed, None)
                    if key not in seen:
                        seen.add(key)
                        found.append(dataclasses.replace(c, freed=freed))
    return found


def _candidate(graph, v, t, chain, roots, position, anchor, available, resident,
               inputs, outputs, only, served=None, upto=None) -> Candidate:
    """The candidate rebuilding ``chain`` at ``t``; with ``only``, just those
    values are handed to later readers (the rest of the chain is transient), and
    with ``upto`` too, only to those that run by step ``upto``; with ``served``,
    those are the readers, and a value is freed only if they are all its later
    readers."""
    freed = []
    consumers: set[int] = set(served or ())
    for op in chain:
        for w in graph.ops[op].outputs:
            readers = graph.users[w]
            late = [u for u in readers if position[u] >= t and u not in chain
                    and (upto is None or anchor[u] <= upto)]
            if served is None and (only is None or w in only):
                consumers.update(late)
            if resident[w] == 0:
                continue
            if (w in outputs or w in inputs or not available(w, t)
                    or (only is not None and w not in only)
                    or (served is not None and not set(late) <= consumers)):
                continue                    # only held while the chain runs
            # an original reader that is recomputed now feeds nobody: it runs
            # (and reads w) at its own step
            early = [position[u] if u in chain else anchor[u]
                     for u in readers if position[u] < t]
            early_end = max(early + [anchor[graph.values[w].producer]])
            if early_end < t - 1:
                freed.append((w, early_end, resident[w]))
    transient = _rebuild_peak(graph, chain, t, position, resident, only)
    block = convex_hull(graph, consumers, position)
    ready = t - 1
    for op in block:
        for w in graph.ops[op].inputs:
            p = graph.values[w].producer
            if p is not None and p not in block and p not in chain:
                ready = max(ready, position[p])
    # Block ops scheduled before the step the block waits for now run after it:
    # what they read that would have been freed by then is held until they run.
    held = {w for op in block if position[op] <= ready for w in graph.ops[op].inputs
            if graph.values[w].producer not in block
            and graph.values[w].producer not in chain and not available(w, ready + 1)}
    transient += sum(resident[w] for w in held)
    cost = sum(op_cost(graph, o) for o in chain)
    return Candidate(v, t, tuple(sorted(chain)), tuple(sorted(consumers)),
                     tuple(sorted(freed)), tuple(sorted(roots)), transient, cost,
                     ready, upto)


def _rebuild_peak(graph: Graph, chain, t: int, position, resident,
                  handed: set[int] | None = None) -> int:
    """The most bytes the chain's results hold at once while it runs in program
    order: a result lives until its last reader in the chain, or on to ``t`` if a
    later op reads it and the copy is handed to later readers (all results, or
    those in ``handed``)."""
    order = sorted(chain, key=position.__getitem__)
    at = {o: i for i, o in enumerate(order)}
    live = peak = 0
    ends: dict[int, list[int]] = {}
    for i, op in enumerate(order):
        for w in graph.ops[op].outputs:
            if resident[w] == 0:
                continue
            readers = graph.users[w]
            inside = [at[u] for u in readers if u in at]
            kept = (handed is None or w in handed) and any(
                u not in at and position[u] >= t for u in readers)
            live += resident[w]
            last = len(order) if kept or not inside else max(inside)
            ends.setdefault(last, []).append(resident[w])
        peak = max(peak, live)
        live -= sum(ends.pop(i, ()))
    return peak


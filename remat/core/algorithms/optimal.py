"""``"optimal"``: the least recompute cost under the limit, by integer programming.

The yardstick for the heuristics. Over the given schedule, every way this planner
knows to drop a value is enumerated as a *candidate*, and an integer program
(HiGHS through ``scipy.optimize.milp``) picks the set of candidates of least total
recompute cost whose estimated memory stays within the limit at every step.

A candidate ``c`` is one :class:`~remat.core.plan.Region`, fixed by:

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
ops read that would have been freed before the block can run). Its cost is the
chain's ``flops + 10 * transcendentals`` (as the greedy engine counts).
Constraints: the selected candidates freeing a value claim it over disjoint
stretches (from the early end to ``z``, or to the end of the program), and one
with an end ``z`` is followed by one freeing the value from ``z``; a chain may
read only values that are still in memory at its ``t`` (not freed by another
selected candidate before then); the estimated bytes during each step and just
before each rebuild are within the limit. Only steps over the limit get a row,
and steps with the same coefficients share one row (the tightest). The graph is
not coarsened: values under ``small_node_bytes`` and fused values are never
candidates, which is what keeps the integer program small. The regions of the ``"path"``
and ``"standard"`` plans are candidates too, so the optimum is never worse than
theirs under the estimate; and if either met the limit more cheaply than
anything the solver found (the estimate misjudged, or the time limit stopped
it), that plan is returned, marked ``status="heuristic"``.

So the result is optimal over *one-level regions built from these candidates,
under the linear memory estimate*, on the given schedule; it is not optimal over
every possible recomputation (Checkmate's space, which also moves ops and nests
recomputation). The estimate is checked the only way every algorithm is checked:
the regions are applied (:func:`~remat.core.plan.apply_plan`) and the rewritten
program simulated (:func:`~remat.core.simulate.simulate`). If the simulation is over
the limit (a block waits for ops the estimate placed after it, overlapping blocks
are merged), the miss is charged to the rebuilds whose blocks were over the limit
(to every candidate with the same chain and readers) and the program is solved
again; if the peak is outside those blocks, it is solved aiming lower by the
miss. A plan the machinery cannot realize is excluded and the program solved
again. The best plan that meets the limit is returned, else the one with the
least simulated peak. So the cost is optimal for the estimate *as corrected by
the simulations seen*; ``status``, ``gap`` and ``bound`` are those of the last
solve.

When the time limit (``options.solver_seconds``) stops the solver, the best plan
found so far is returned with its proven relative gap (``PlanResult.gap``). A
limit no selection can meet is reported with ``status="infeasible"``: the plan
returned then has the least estimated peak any selection reaches.

Example::

    >>> from remat.core.options import RematOptions
    >>> from remat.core.simulate import simulate
    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_input(10)
    >>> a1, = b.add_op("f", [x], [100], flops=5)
    >>> a2, = b.add_op("f", [a1], [100], flops=5)
    >>> y, = b.add_op("g", [a2], [10])
    >>> z, = b.add_op("h", [y, a1], [10])
    >>> g = b.build(outputs=[z])
    >>> r = plan_optimal(g, (0, 1, 2, 3), RematOptions(220, "optimal", small_node_bytes=0))
    >>> r.met, r.extra_flops, r.status
    (True, 5.0, 'optimal')
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from collections import deque
from typing import Sequence

import numpy as np

from ..graph import Graph
from ..options import RematOptions
from ..plan import PlanError, Region, convex_hull
from ..simulate import Timeline, anchor_steps, simulate
from .greedy import PlanResult, evaluate, op_cost
from .path import plan_path
from .recomputable import recomputable
from .standard import plan_standard

__all__ = ["plan_optimal", "Candidate", "candidates"]

log = logging.getLogger("remat")

#: The deepest chain tried for one drop (in live values passed through).
MAX_DEPTH = 24
#: Times the program is solved again after the simulation disagrees.
_ROUNDS = 12


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


def candidates(graph: Graph, schedule: Sequence[int], timeline: Timeline,
               options: RematOptions, seeds: Sequence[Region] = ()
               ) -> list[Candidate]:
    """Every candidate drop of ``graph`` over ``schedule`` (see the module
    docstring), and one per region of ``seeds``.

    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_input(10)
    >>> a, = b.add_op("f", [x], [100])
    >>> a2, = b.add_op("f", [a], [100])
    >>> y, = b.add_op("g", [a2], [10])
    >>> z, = b.add_op("h", [y, a], [10])
    >>> g, order = b.build([z]), (0, 1, 2, 3)
    >>> [(c.value, c.t, c.chain) for c in candidates(
    ...     g, order, simulate(g, order), RematOptions(0, "optimal", small_node_bytes=0))]
    [(1, 3, (0,))]
    """
    values, ops, users = graph.values, graph.ops, graph.users
    fused = timeline.fused
    anchor = anchor_steps(graph, schedule)
    position = [0] * graph.num_ops
    for step, op in enumerate(schedule):
        position[op] = step
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


class _Program:
    """The integer program over a candidate list: rows ``A @ x <= ub``."""

    def __init__(self, timeline: Timeline, cands: list[Candidate]):
        self.cands = cands
        self.during = timeline.live_during_bytes
        self.after = timeline.live_after_bytes
        self.start = timeline.input_bytes + timeline.output_bytes
        holders: dict[int, list[int]] = {}
        early_end: dict[tuple[int, int], int] = {}
        for i, c in enumerate(cands):
            for w, e, _ in c.freed:
                holders.setdefault(w, []).append(i)
                early_end[(i, w)] = e
        # A value is freed by at most one selected candidate, except that a copy
        # serving the readers up to step z (``upto``) is followed by another
        # candidate freeing the value from z on. So each holder of w claims w
        # from its early end, to z or to the end: claims may not overlap (a row
        # per claim's start), and a copy up to z needs a holder from z.
        claim_end = {(i, w): (c.upto if c.upto is not None and c.value == w
                              else float("inf"))
                     for i, c in enumerate(cands) for w, _, _ in c.freed}

        def overlapping(w: int, among: list[int]) -> list[list[int]]:
            """The holders of ``w`` in ``among`` whose claims share a step, one
            list per claim start (any two overlapping claims share one)."""
            groups = {frozenset(i for i in among
                                if early_end[(i, w)] <= start < claim_end[(i, w)])
                      for start in {early_end[(i, w)] for i in among}}
            # a group inside another needs no row of its own
            return [sorted(g) for g in groups if not any(g < h for h in groups)]

        self.groups = [g for w, h in holders.items() for g in overlapping(w, h)
                       if len(g) > 1]
        self.successors = [(i, [j for j in holders[w] if early_end[(j, w)] == end])
                           for (i, w), end in claim_end.items() if end != float("inf")]
        # a chain reads only values still in memory at its step: for each value
        # r read at step t, a switch u[r, t] >= x of every chain reading it then,
        # and u[r, t] + x of the candidates freeing r before t <= 1 (a row per
        # group of overlapping claims)
        readers: dict[tuple[int, int], list[int]] = {}
        for i, c in enumerate(cands):
            for r in c.roots:
                if r in holders:
                    readers.setdefault((r, c.t), []).append(i)
        self.conflicts: list[tuple[list[int], list[list[int]]]] = []
        for (r, t), who in readers.items():
            freeing = [j for j in holders[r] if early_end[(j, r)] < t and j not in who]
            if freeing:
                self.conflicts.append((who, overlapping(r, freeing)))
        self.cost = np.array([c.cost for c in cands], dtype=float)
        self.cuts: list[list[int]] = []     # selections the machinery rejected
        # bytes the simulation saw a candidate's block hold beyond the estimate
        self.penalty = [0] * len(cands)
        self.same_block: dict[tuple, list[int]] = {}
        for i, c in enumerate(cands):
            self.same_block.setdefault((c.chain, c.consumers), []).append(i)

    def charge(self, i: int, nbytes: int) -> None:
        """Adds ``nbytes`` to what candidate ``i``'s rebuild holds, and to every
        candidate with the same chain and readers (the same block)."""
        key = (self.cands[i].chain, self.cands[i].consumers)
        for j in self.same_block.get(key, [i]):
            self.penalty[j] += nbytes

    def memory_rows(self, target: int) -> dict[tuple, float]:
        """Rows ``sum(coef * x) <= ub`` for the steps that can exceed ``target``,
        as ``{((i, coef), ...): ub}`` (rows with the same coefficients keep the
        tightest bound)."""
        rows: dict[tuple, float] = {}

        def add(row: dict[int, int], ub: float) -> None:
            key = tuple(sorted((i, b) for i, b in row.items() if b))
            rows[key] = min(rows.get(key, float("inf")), ub)

        over = [s for s in range(len(self.during)) if self.during[s] > target]
        during_rows: dict[int, dict[int, int]] = {s: {} for s in over}
        for i, c in enumerate(self.cands):
            for _, e, nbytes in c.freed:
                # out of memory while the steps strictly between e and t run
                for k in range(bisect.bisect_right(over, e), len(over)):
                    s = over[k]
                    if s >= c.t:
                        break
                    row = during_rows[s]
                    row[i] = row.get(i, 0) - nbytes
        for s in over:
            add(during_rows[s], target - self.during[s])
        # while each rebuild runs: live after the step it waits for, less what
        # the selection freed then (its own dropped values included), plus what
        # the rebuild holds
        by_ready: dict[int, list[int]] = {}
        for i, c in enumerate(self.cands):
            by_ready.setdefault(c.ready, []).append(i)
        for ready, here in by_ready.items():
            base = self.after[ready] if ready >= 0 else self.start
            if base + sum(self.cands[i].transient + self.penalty[i]
                          for i in here) <= target:
                continue
            row = {i: self.cands[i].transient + self.penalty[i] for i in here}
            mine = set(here)
            for i, c in enumerate(self.cands):
                for _, e, nbytes in c.freed:
                    if e <= ready < c.t or (i in mine and e <= ready):
                        row[i] = row.get(i, 0) - nbytes
            add(row, target - base)
        return rows

    def solve(self, target: int, seconds: float, verbose: bool, min_peak: bool = False):
        """Solves for ``target``; returns scipy's result and the number of rows.

        With ``min_peak``, the limit becomes a variable ``P`` to minimize (the
        least estimated peak any selection reaches); cost breaks ties.
        """
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix

        k = len(self.cands)
        extra = k + len(self.conflicts)     # the peak variable, with min_peak
        nvar = extra + (1 if min_peak else 0)
        r, col, val, ub = [], [], [], []

        def row(entries, bound):
            for i, b in entries:
                r.append(len(ub))
                col.append(i)
                val.append(float(b))
            ub.append(float(bound))

        rows = self.memory_rows(0 if min_peak else target)
        for key, bound in rows.items():
            if min_peak:        # sum(coef x) <= P - base, with base = -bound
                row(list(key) + [(extra, -1.0)], bound)
            elif not key and bound < 0:
                row([], bound)  # a step no candidate relieves: infeasible
            elif key:
                row(key, bound)
        for group in self.groups:
            row([(i, 1) for i in group], 1)
        for i, following in self.successors:     # x_i <= sum of x_following
            row([(i, 1)] + [(j, -1) for j in following], 0)
        for n, (who, freeing) in enumerate(self.conflicts):
            u = k + n
            for i in who:
                row([(i, 1), (u, -1)], 0)
            for group in freeing:
                row([(u, 1)] + [(j, 1) for j in group], 1)
        for cut in self.cuts:
            row([(i, 1) for i in cut], len(cut) - 1)
        c = np.zeros(nvar)
        lb, hi = np.zeros(nvar), np.ones(nvar)
        integrality = np.ones(nvar)
        integrality[k:] = 0                 # switches are integral at an optimum
        if min_peak:
            scale = 1.0 / (float(self.cost.sum()) + 1.0)
            c[:k] = self.cost * scale * 1e-3
            c[extra] = 1.0
            hi[extra] = np.inf
        else:
            c[:k] = self.cost
        constraints = []
        if ub:
            a = coo_matrix((val, (r, col)), shape=(len(ub), nvar)).tocsr()
            constraints = [LinearConstraint(a, -np.inf, np.array(ub))]
        res = milp(c, integrality=integrality, bounds=Bounds(lb, hi),
                   constraints=constraints,
                   options={"disp": verbose, "time_limit": max(seconds, 0.1)})
        return res, len(ub)


def plan_optimal(graph: Graph, schedule: Sequence[int],
                 options: RematOptions) -> PlanResult:
    """Plans with the ``"optimal"`` algorithm (see the module docstring)."""
    limit = options.model_target_bytes
    clock = time.perf_counter()
    baseline = simulate(graph, schedule)
    heuristics = [heuristic(graph, schedule, options)
                  for heuristic in (plan_path, plan_standard)]
    seeds = [r for h in heuristics for r in h.regions]
    cands = candidates(graph, schedule, baseline, options, seeds)
    program = _Program(baseline, cands)
    say = log.info if options.verbose else log.debug
    say("remat optimal: %d ops, %d candidates, %d exclusive groups, %d conflicts "
        "(%.2f s)", graph.num_ops, len(cands), len(program.groups),
        len(program.conflicts), time.perf_counter() - clock)

    def result(regions, rw, tl, **kw) -> PlanResult:
        return PlanResult(tuple(rw.regions), rw, tl, baseline, limit,
                             num_candidates=len(cands), **kw)

    if baseline.peak_bytes <= limit or not cands:
        rw, tl = evaluate(graph, schedule, [])
        return result([], rw, tl, status="optimal" if baseline.peak_bytes <= limit
                      else "no_candidates", gap=0.0 if baseline.peak_bytes <= limit
                      else None, bound=0.0 if baseline.peak_bytes <= limit else None)

    deadline = clock + options.solver_seconds
    target = limit
    best: PlanResult | None = None
    solve_s = 0.0
    status, gap, bound = "", None, None
    rounds = 0
    for rounds in range(1, _ROUNDS + 1):
        left = deadline - time.perf_counter()
        if left <= 0 and best is not None:
            break
        t0 = time.perf_counter()
        res, nrows = program.solve(target, left, options.verbose)
        solve_s += time.perf_counter() - t0
        say("remat optimal: round %d, target %d bytes, %d rows: %s (%.2f s)", rounds,
            target, nrows, res.message, time.perf_counter() - t0)
        if res.x is None:
            if best is not None:
                break       # aiming lower went out of reach: keep what met before
            status = "infeasible" if res.status == 2 else "time_limit"
            break
        chosen = [i for i in range(len(cands)) if res.x[i] > 0.5]
        gap = float(res.mip_gap) if res.mip_gap is not None else None
        bound = float(res.mip_dual_bound) if res.mip_dual_bound is not None else None
        status = "optimal" if res.status == 0 else "time_limit"
        regions = [Region(cands[i].chain, cands[i].consumers) for i in chosen]
        try:
            rw, tl = evaluate(graph, schedule, regions)
        except PlanError as e:
            say("remat optimal: selection rejected by apply_plan (%s); excluded", e)
            program.cuts.append(chosen)
            continue
        got = result(regions, rw, tl, status=status, gap=gap, bound=bound)
        say("remat optimal: %d candidates chosen, cost %.4g, simulated peak %d bytes "
            "(limit %d)", len(chosen), float(program.cost[chosen].sum()),
            tl.peak_bytes, limit)
        if (best is None or (got.met and not best.met)
                or (got.met == best.met and (
                    got.extra_flops < best.extra_flops if got.met
                    else tl.peak_bytes < best.timeline.peak_bytes))):
            best = got
        if got.met:
            break
        # The simulation saw more than the estimate. Where a rebuild's block is
        # over the limit, charge the miss to the candidates in it (their block
        # holds more than the estimate knew); elsewhere, aim lower by the miss.
        in_charged_block = False
        step_of = {op: step for step, op in enumerate(rw.schedule)}
        for i in chosen:
            # originals keep their ids in the rewrite: a consumer's block is its region
            k = rw.region[cands[i].consumers[0]] if cands[i].consumers else -1
            if k < 0:
                continue
            first = step_of[rw.blocks[k][0]]
            steps = range(first, first + len(rw.blocks[k]))   # blocks are contiguous
            miss = max(tl.live_during_bytes[s] for s in steps) - limit
            if miss > 0:
                program.charge(i, miss)
                in_charged_block |= tl.peak_step in steps
        if not in_charged_block:
            target -= tl.peak_bytes - limit
    if best is None:
        # nothing meets the limit: the least estimated peak instead
        res, _ = program.solve(limit, max(deadline - time.perf_counter(), 1.0),
                               options.verbose, min_peak=True)
        chosen = ([i for i in range(len(cands)) if res.x[i] > 0.5]
                  if res.x is not None else [])
        regions = [Region(cands[i].chain, cands[i].consumers) for i in chosen]
        try:
            rw, tl = evaluate(graph, schedule, regions)
        except PlanError:
            rw, tl = evaluate(graph, schedule, [])
        best = result(regions, rw, tl, status=status or "infeasible", gap=None,
                      bound=None)
        say("remat optimal: limit %d bytes out of reach (%s); least peak found %d",
            limit, best.status, tl.peak_bytes)
    known = [h for h in heuristics if h.met]
    if known:
        cheapest = min(known, key=lambda h: h.extra_flops)
        if not best.met or cheapest.extra_flops < best.extra_flops:
            # A heuristic's plan (its regions are candidates too) beats every
            # selection the solver found or proved under the estimate.
            say("remat optimal: keeping a heuristic's plan (%s)", best.status)
            best = result(cheapest.regions, cheapest.rewritten, cheapest.timeline,
                          status="heuristic", gap=None, bound=bound)
    elif not best.met:      # out of reach: the least simulated peak known
        lowest = min(heuristics, key=lambda h: h.timeline.peak_bytes)
        if lowest.timeline.peak_bytes < best.timeline.peak_bytes:
            best = result(lowest.regions, lowest.rewritten, lowest.timeline,
                          status=best.status, gap=None, bound=None)
    return dataclasses.replace(best, solve_seconds=solve_s, rounds=rounds)

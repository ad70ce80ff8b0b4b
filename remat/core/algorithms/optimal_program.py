"""The integer program of ``"optimal"``: which candidates to select.

Variables: ``x[i]`` in {0, 1} selects candidate ``i``
(:mod:`~remat.core.algorithms.optimal_candidates`); one continuous switch
``u`` per conflict (below), integral at an optimum; and, when solving for the
least peak instead of a limit, a continuous peak ``P``. The objective is the
total recompute cost of the selection (with ``P``: the peak, cost breaking ties).

Constraints, as rows ``A @ x <= ub``:

* the selected candidates freeing a value claim it over disjoint stretches (from
  the early end to ``z``, or to the end of the program): a row per group of
  overlapping claims;
* a candidate with an end ``z`` (``upto``) is followed by one freeing the value
  from ``z``;
* a chain may read only values still in memory at its ``t``: for each value
  ``r`` read at ``t``, ``u[r, t] >= x`` of every chain reading it then, and
  ``u[r, t]`` plus the candidates freeing ``r`` before ``t`` is at most 1 (a
  row per group of overlapping claims);
* the estimated bytes during each step, and just before each rebuild (live after
  the step it waits for, plus what it holds, plus any ``penalty`` the simulation
  charged its block), are within the target. Only steps that can exceed the
  target get a row, and rows with the same coefficients share one (the
  tightest);
* each selection the plan machinery rejected (``cuts``) is excluded.

Solved by HiGHS through ``scipy.optimize.milp``, with a time limit.
"""

from __future__ import annotations

import bisect

import numpy as np

from ..simulate import Timeline
from .optimal_candidates import Candidate

__all__ = ["Program"]


class Program:
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

    def least_peak(self, seconds: float, verbose: bool):
        """The selection of least estimated peak (:meth:`solve` with ``min_peak``):
        scipy's result and the number of rows."""
        return self.solve(0, seconds, verbose, min_peak=True)

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


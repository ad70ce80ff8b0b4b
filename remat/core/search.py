"""The search of the automatic pass: which plans to compile, and which to answer with.

The planner plans in a model of memory; the compiler's figure of the compiled
program is the truth, and the two disagree by a few percent in ways no model
predicts (how the compiler packs its heap, what it fuses and reorders). So the
search never trusts the model's verdict: each plan it compiles becomes a measured
:class:`Point` (compiled footprint, extra FLOPs), and a limit is answered with the
cheapest point known within it.

Columns and rungs. A column is one way of planning (an algorithm on one order of
the program's ops). It is asked for plans only at a fixed ladder of model
targets: :data:`RUNGS` rungs evenly spaced from the column's floor (the least peak
it can reach) up to the plain program's peak, and :data:`FINE_RUNGS` more just
above the floor. A plan depends only on its column and rung, so the plans of a
program form a finite set, the same whatever limits are asked: its frontier,
compiled lazily, as deep as the limits asked need.

Answering a limit (bytes in the compiler's terms), :meth:`Frontier.answer`:

1. The plain program, if it is within the limit.
2. On each column in turn, a walk: from the highest rung at or below the
   column's estimate of the limit in the model, compile; while the compiler reads
   the plan over the limit, step down (:mod:`remat.core.steps`: by the miss
   converted into the model, at least one rung, further after misses that did
   not fall); once a plan is within it, refine between it and the last miss
   (as many plans as a bisect of the rungs between them takes, and at least
   :data:`REFINES`: a higher rung recomputes less), at the rung the line
   through their two footprints puts at the limit, and halfway where it puts
   none between them or once such a rung missed; then, with the refines left,
   a quick column's rungs the walk stepped over above its lowest miss, top
   down (a rung between two misses can meet).
   A twin's walk (``Column.twin_of``: its column's plans under another
   lowering) ends at a miss the compiler reads byte for byte as the same plan
   of its column, below every point that recomputes nothing: there the plan
   changed what the compiler holds at its peak and the lowering did not, and
   the plans below are its column's, walked before it.
   A walk that has compiled its share of :data:`MAX_COMPILES` (divided evenly
   among the columns but the last resorts) without meeting the limit stops:
   when the compiler reads a column's plans at one footprint while the model
   drops, its walk steps down one rung at a time, and would leave the other
   columns (other orders, whose plans it may read lower) nothing. Once every
   column had its turn, the walks so cut resume where they stopped, in the same
   order and on the same terms, whatever the answer's rank (step 2c): a lower
   limit's walk would have gone on from there, and can meet this one with less
   recompute. A walk resumed after an answer steps from its last miss as a walk
   bound by that answer does (one rung where the footprint fell), not as far
   as the step it was cut before.
   Columns that plan quickly are walked first, in their given order, then the
   others (a slow column's plan may take several compiles' time); a last
   resort (``Column.last_resort``) only in step 2d. Once a walk
   has met the limit, a column is walked only if it plans quickly, has the
   answer's rank (or names it in ``walked_after``), and its plan at its start
   (planned, not compiled) recomputes less than the answer so far, by
   :data:`MIN_SAVING` of it at least: its walk plans nothing above its start,
   and lower rungs recompute more. Nor does a refine compile a plan that saves
   less than that share of the recompute of the plan that met the limit: a
   compile is not spent to save a sliver. A point already known within the
   limit (compiled for a limit asked before) bounds every walk in the same way,
   no slow column is walked, and once the search reaches the column that
   planned it, it counts as that column's walk having met the limit: a lower
   limit asked later walks no column that the higher one's search passed over
   after meeting it.
   Before the first slow column is walked while no plan is known within the
   limit (step 2b, :meth:`Frontier.fill_skipped`): on each quick column of the
   first rank, the rungs its walk stepped over (between its start and its
   lowest rung compiled), top down, its share of compiles at most. A step
   assumes the compiler's footprint falls with the model's peak; where it does
   not, the rung that meets can lie in what the step jumped over, and a
   compile there costs less than a slow plan.
   Once a slow column met the limit (every quick walk missed it), each last
   resort that plans quickly is walked too, bound by that answer (step 2d):
   the slow plans recompute the most, and another lowering may read a quick
   plan within the limit.
3. If no walk met it and no point was known within it, on each column every
   rung at or below its start not compiled yet (the last resorts' last), until
   a plan is within the limit; a slow column's only until its share of plans
   repeated one compiled (a solver below its reach answers every lower target
   with its plan of least peak: each such rung costs a solve, often longer
   than a compile, and adds no point).
4. The answer: the cheapest point known (from any limit asked of this frontier
   before, too) within the limit; None if no plan compiled is within it.

Steps 2 and 3 compile at most :data:`MAX_COMPILES` plans for one limit; then the
search stops and step 4 answers (``Frontier.out_of_compiles`` is set).

Compiling ahead. Given a ``compile_ahead`` callable, each compile starts beside
it the one the search may make next: while no plan is within the limit, that of
the walk after this one should it fail (or in step 3, the next rung), and in a
refine, the next refine should this one meet the limit. A point enters the
frontier only when the search asks for it: the answers are the same without it.

Guarantees, by construction:

* The start rung of a column never falls as the limit rises, and a limit is
  refused only when every rung of every column at or below its start is over it,
  when its search stopped at ``MAX_COMPILES``, or when a slow column's fill
  ended on repeated plans (``untried``). So a limit that any one column
  meets (``algorithm=`` selects one algorithm's columns) is met by a frontier
  holding that column and others, since a column plans nothing above its start
  for a limit, unless the search stopped first or left that column's rung.
* Monotone: a point within a limit is within every higher one. A higher limit
  asked afterwards is met with no more recompute. A higher limit asked of a fresh
  frontier is met too (unless its search stops first, or leaves that rung): the
  plan that met the lower one sits at or below the lower limit's start, so at or
  below the higher limit's, where step 3 looks.

>>> col = Column("demo", rungs=(10, 20, 30), model_per_xla=1.0,
...              estimate=lambda limit: limit,
...              plan=lambda target: Candidate(target, target, 100.0 - target))
>>> f = Frontier([col], lambda c: Point(c.key, c.model_peak + 5, c.extra_flops, "demo"))
>>> f.answer(22).footprint, f.compiles       # rung 20 reads 25: one rung down
(15, 2)
>>> f.answer(26).footprint, f.answer(26).extra_flops, f.compiles
(25, 80.0, 2)
>>> f.answer(40).footprint, f.answer(9) is None, f.exhausted
(35, True, True)
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
from collections.abc import Callable, Hashable, Sequence

from .columns import FINE_RUNGS, RUNGS, Candidate, Column, Point, rungs
from .steps import rung_below, rung_between, rungs_to_step

__all__ = ["RUNGS", "FINE_RUNGS", "REFINES", "MIN_SAVING", "MAX_COMPILES", "Candidate",
           "Point", "Column", "Frontier", "rungs"]

log = logging.getLogger("remat")

#: Plans compiled to refine back up towards a limit after a step down overshot
#: it (each one recomputes less, if the compiler reads it within), where a
#: bisect of the gap takes fewer: a gap of g rungs gets log2(g).
REFINES = 2
#: The least share of an answer's extra FLOPs a plan must save to be compiled in
#: search of a cheaper answer (a refine, or a walk after the limit was met): the
#: plans of neighbouring rungs often differ by a fraction of a percent.
MIN_SAVING = 0.05
#: Plans one limit's search compiles at most (walks and fill together). Without a
#: bound, a limit the compiler reads every plan of over (recomputing makes it hold
#: more, not less) would compile every rung of every column: hundreds.
MAX_COMPILES = 40


class _OutOfCompiles(Exception):
    """The search for one limit has compiled :data:`MAX_COMPILES` plans."""


class Frontier:
    """The points of one program compiled so far, and the search over them.

    Arguments:
      columns: the ways of planning, in the order the walks try them.
      measure: a :class:`Candidate` -> its :class:`Point` (compiles it).
      plain: the plain program's point, if known (it meets every limit above it).
      max_compiles: plans one limit's search compiles at most
        (:data:`MAX_COMPILES`); ``out_of_compiles`` says whether the last
        answer's search stopped there, and ``untried`` how many rungs its fill
        left to slow columns that repeated their plans (step 3).
      compile_ahead: a :class:`Candidate` -> None, starting its compile beside
        the search (``measure`` then waits for it), or None (the module's
        "Compiling ahead": the answers are the same either way).
    """

    def __init__(self, columns: Sequence[Column], measure: Callable[[Candidate], Point],
                 plain: Point | None = None, max_compiles: int | None = None,
                 compile_ahead: Callable[[Candidate], None] | None = None):
        self.columns = tuple(columns)
        self._measure = measure
        self._compile_ahead = compile_ahead
        self.plain = plain
        self.points: dict[Hashable, Point] = {}        # by plan key
        if plain is not None:      # a plan recomputing nothing is the plain program
            self.points[plain.key] = plain
        self._planned: dict[tuple[int, int], Candidate] = {}   # (column, rung)
        self._measured: set[tuple[int, int]] = set()           # (column, rung)
        self.compiles = 0
        self.max_compiles = MAX_COMPILES if max_compiles is None else max_compiles
        self._stop_at: int | None = None    # while answering: compiles to stop at
        self._cut: dict[int, tuple] = {}    # walks cut at their share: (k, missed, before)
        self.out_of_compiles = False    # whether the last answer's search hit the bound
        self.untried = 0    # rungs the last answer's fill left (slow plans repeating)

    def candidate(self, column: int, rung: int) -> Candidate:
        """The plan of ``column`` at ``rung`` (each planned once)."""
        cand = self._planned.get((column, rung))
        if cand is None:
            col = self.columns[column]
            cand = self._planned[column, rung] = col.plan(col.rungs[rung])
        return cand

    def point(self, column: int, rung: int,
              ahead: Callable[[Hashable], tuple[int, int] | None] | None = None
              ) -> Point:
        """The plan of ``column`` at ``rung``, compiled (each plan once); if it
        is compiled now, ``ahead(its key)`` names the (column, rung) whose plan
        starts compiling beside it (with ``compile_ahead``)."""
        cand = self.candidate(column, rung)
        known = self.points.get(cand.key)
        if known is None and self._stop_at is not None and self.compiles >= self._stop_at:
            self.out_of_compiles = True
            raise _OutOfCompiles        # (the rung stays to compile)
        self._measured.add((column, rung))
        if known is None:
            if self._compile_ahead is not None:
                self._compile_ahead(cand)
                after = ahead(cand.key) if ahead is not None else None
                if after is not None and self.candidate(*after).key not in self.points:
                    self._compile_ahead(self.candidate(*after))
            self.compiles += 1
            col = self.columns[column]
            known = self.points[cand.key] = dataclasses.replace(
                self._measure(cand), column=col.name, rank=col.rank)
            log.info("remat: %s at model target %d (planned peak %d): footprint %d, "
                     "+%.3g FLOPs", known.column, col.rungs[rung],
                     cand.model_peak, known.footprint, known.extra_flops)
        return known

    def walk(self, column: int, limit: int, bound: float = math.inf,
             resume: tuple[int, int | None, int | None] | None = None) -> bool:
        """Step 2 of the module's search on one column; True if a plan met it.

        A plan recomputing ``bound`` FLOPs or more (an answer's) is not
        compiled: the walk and its refines end there, and at a start plan
        (resumed: the last miss) not saving :data:`MIN_SAVING` of ``bound`` or a
        refine not saving it of the plan that met the limit; below its start,
        resumed or not, it compiles any plan recomputing less than ``bound``.
        A walk cut at its share records its next rung and last two misses in
        ``_cut``; ``resume`` takes them up, with no share, stepping from the
        last miss on ``bound``'s terms."""
        col = self.columns[column]
        k, missed, before = resume or (self.start(column, limit), None, None)
        # while no plan is known within the limit, each compile starts the next
        # column's beside it (once one is, a column is walked only if it saves)
        ahead = (lambda key: self._next_start(column, limit, key)) if bound == math.inf else None
        first, share = self.compiles, self._share()
        dearest = bound * (1 - MIN_SAVING)     # the start plan must save a share
        if missed is not None:      # resumed below its start: as a lower limit's walk
            if self.candidate(column, missed).extra_flops >= dearest:
                return False    # below a miss that saves too little: so would it
            dearest = bound
            k = self._below(column, missed, self.point(column, missed).footprint, before,
                            limit, bound)
        while True:
            if resume is None and self.compiles - first >= share:
                self._cut[column] = k, missed, before
                return False        # the other columns' share (nothing more planned)
            if self.candidate(column, k).extra_flops >= dearest:
                return False
            dearest = bound         # below the start, any plan recomputing less answers
            p = self.point(column, k, ahead)
            if p.footprint <= limit:
                break
            if k == 0 or self._reads_as_twin(column, k, p.footprint):
                return False
            k, missed, before = (self._below(column, k, p.footprint, missed, limit, bound),
                                 k, missed)
        met, refines, secant, lowest_miss = k, 0, True, missed
        # a bisect back up a gap of g rungs takes about log2(g) plans: a widened
        # step down leaves a wider gap, and REFINES alone would stop short of it
        budget = max(REFINES, (missed - met - 1).bit_length()) if missed is not None else 0
        while refines < budget and missed - met > 1:
            mid = self._between(column, met, missed, limit) if secant else met
            if mid == met:          # no line to go by, or none it puts within: halfway
                mid, secant = (met + missed) // 2, False
            if self.candidate(column, mid).extra_flops >= min(
                    bound, self.point(column, met).extra_flops * (1 - MIN_SAVING)):
                break               # too little less recompute (lower rungs: less still)
            refines += 1
            # beside it, the next refine should it meet the limit and the line
            # put no rung within (as it seldom does, once a rung met it): halfway up
            up = (mid + missed) // 2
            ahead = (lambda key: (column, up)) if refines < budget and up > mid else None
            if self.point(column, mid, ahead).footprint <= limit:
                met = mid
            else:
                missed, secant = mid, False
        # then the rungs stepped over above the lowest miss (a footprint between
        # two misses can be within), top down, on a quick column
        skipped = (reversed(range(lowest_miss + 1, self.start(column, limit)))
                   if lowest_miss is not None and col.plans_quickly else ())
        for r in (r for r in skipped if (column, r) not in self._measured):
            if refines < REFINES and self.candidate(column, r).extra_flops < min(
                    bound, self.point(column, met).extra_flops * (1 - MIN_SAVING)):
                refines += 1
                if self.point(column, r).footprint <= limit:
                    break
        return True

    def _below(self, column: int, k: int, footprint: int, missed: int | None,
               limit: int, bound: float) -> int:
        """The rung a walk compiles after a miss at ``k`` read at ``footprint``
        (its miss before at ``missed``; :mod:`remat.core.steps`)."""
        col = self.columns[column]
        hi = None if missed is None else self.point(column, missed).footprint
        step = rungs_to_step(col.rungs, k, lo=footprint, missed=missed, hi=hi, limit=limit,
                             bounded=bound < math.inf)
        return rung_below(col.rungs, k, peak=self._planned[column, k].model_peak,
                          footprint=footprint, limit=limit,
                          model_per_xla=col.model_per_xla, step=step)

    def _reads_as_twin(self, column: int, k: int, footprint: int) -> bool:
        """Whether ``column`` is a twin (``Column.twin_of``) whose plan at rung
        ``k`` the compiler reads at ``footprint``, byte for byte as the same plan
        of the column it twins (compiled already), and below every point that
        recomputes nothing: the plan changed the compiler's peak and the
        lowering did not, and the twin's walk stops. (A plan read as a program
        with no recompute left the peak where it was: that says nothing of
        the lowering.)"""
        twin_of = self.columns[column].twin_of
        base = next((c for c, col in enumerate(self.columns) if col.name == twin_of), None)
        return (base is not None and (base, k) in self._measured
                and self.point(base, k).footprint == footprint
                and all(footprint < p.footprint for p in self.points.values()
                        if p.extra_flops == 0))

    def _between(self, column: int, met: int, missed: int, limit: int) -> int:
        """The rung to refine with between ``met`` and ``missed`` (:mod:`remat.core.steps`)."""
        return rung_between(self.columns[column].rungs, met=met,
                            lo=self.point(column, met).footprint, missed=missed,
                            hi=self.point(column, missed).footprint, limit=limit)

    def start(self, column: int, limit: int) -> int:
        """The rung a column starts at for ``limit``: the highest at or below its
        estimate of it (else the lowest); never lower for a higher limit."""
        col = self.columns[column]
        return max(bisect.bisect_right(col.rungs, col.estimate(limit)) - 1, 0)

    def fill(self, limit: int) -> bool:
        """Step 3: the rungs at or below each column's start not compiled yet, from
        the top down, until a plan meets ``limit``; True if one did. A slow
        column's fill ends once its share of plans repeated one compiled
        (``untried`` counts the rungs it left)."""
        columns = sorted(range(len(self.columns)), key=lambda c: self.columns[c].last_resort)
        todo = [(c, k) for c in columns for k in reversed(range(self.start(c, limit) + 1))
                if (c, k) not in self._measured]
        repeats, share = dict.fromkeys(range(len(self.columns)), 0), self._share()
        for j, (c, k) in enumerate(todo):
            if not self.columns[c].plans_quickly:
                if repeats[c] >= share:
                    self.untried += 1
                    continue
                repeats[c] += self.candidate(c, k).key in self.points
            # beside it, the next rung's plan (a slow column's: planned in turn)
            after = todo[j + 1] if j + 1 < len(todo) else None
            after = after if after is not None and self.columns[after[0]].plans_quickly else None
            if self.point(c, k, lambda key: after).footprint <= limit:
                return True
        return False

    def _first_within(self, limit: int, todo: list[tuple[int, int]]) -> bool:
        """Compiles the (column, rung) plans of ``todo`` in turn (each with the
        next beside it) until one is within ``limit``; True if one was."""
        for j, (c, k) in enumerate(todo):
            after = todo[j + 1] if j + 1 < len(todo) else None
            if self.point(c, k, lambda key: after).footprint <= limit:
                return True
        return False

    def fill_skipped(self, limit: int) -> bool:
        """Step 2b: on each column of the first rank that plans quickly, the
        rungs its walk stepped over (below its start, above its lowest rung
        compiled), from the top down, its share of compiles at most, until a
        plan meets ``limit``; True if one did."""
        quick = [c for c in self._walk_order() if self.columns[c].plans_quickly]
        if not quick:
            return False
        rank, share, todo = min(self.columns[c].rank for c in quick), self._share(), []
        for c in quick:
            walked = [k for k in range(self.start(c, limit) + 1) if (c, k) in self._measured]
            if self.columns[c].rank == rank and walked:
                todo += [(c, k) for k in reversed(range(min(walked) + 1, max(walked)))
                         if (c, k) not in self._measured][:share]
        return self._first_within(limit, todo)

    def _share(self) -> int:
        """Plans one walk compiles before it is cut (``MAX_COMPILES`` divided)."""
        return max(self.max_compiles // max(sum(not c.last_resort for c in self.columns), 1), 1)

    def _walk_order(self) -> list[int]:
        """The columns in the order the walks take them: those that plan quickly
        first, then the others, each group in the given order; no last resort."""
        return sorted((c for c in range(len(self.columns)) if not self.columns[c].last_resort),
                      key=lambda c: not self.columns[c].plans_quickly)

    def _next_start(self, column: int, limit: int, key: Hashable
                    ) -> tuple[int, int] | None:
        """The start of the first column walked after ``column`` for ``limit``
        that plans quickly, would be walked after its answer too (of its rank,
        or naming it in ``walked_after``: its start is planned either way), and
        whose start's plan is neither compiled nor the plan of ``key`` (None if
        none)."""
        order, rank = self._walk_order(), self.columns[column].rank
        for c in order[order.index(column) + 1:]:
            col, k = self.columns[c], self.start(c, limit)
            if (col.plans_quickly and (col.rank == rank or rank in col.walked_after)
                    and (c, k) not in self._measured
                    and self.candidate(c, k).key not in (key, *self.points)):
                return c, k
        return None

    def update(self, point: Point) -> None:
        """Puts ``point`` in place of its key's (a truer figure of one plan)."""
        if self.plain is not None and self.plain.key == point.key:
            self.plain = point
        self.points[point.key] = point

    def best_under(self, limit: int) -> Point | None:
        """The cheapest point known within ``limit`` (fewest extra FLOPs, then
        the lowest rank, then the least footprint)."""
        within = [p for p in self.points.values() if p.footprint <= limit]
        return min(within, key=lambda p: (p.extra_flops, p.rank, p.footprint), default=None)

    def lowest(self) -> Point | None:
        """The point of the least footprint known."""
        return min(self.points.values(), key=lambda p: (p.footprint, p.extra_flops), default=None)

    def answer(self, limit: int) -> Point | None:
        """The cheapest point within ``limit`` after searching for it (the module's
        steps 1-4, compiling at most ``max_compiles`` plans); None if no plan
        compiled is within it."""
        self.out_of_compiles, self._cut, self.untried = False, {}, 0
        if self.plain is not None and self.plain.footprint <= limit:
            return self.plain
        self._stop_at = self.compiles + self.max_compiles
        try:
            self._search(limit)
        except _OutOfCompiles:
            pass            # (step 4 answers)
        finally:
            self._stop_at = None
        return self.best_under(limit)

    def _search(self, limit: int) -> None:
        best = self.best_under(limit)       # from the limits asked before, if any
        met = None      # the point whose rank selects the columns walked after it
        skipped_filled, order = False, self._walk_order()

        def turns():        # each column's walk, then (2c) the walks cut at their share
            yield from ((c, None) for c in order)
            yield from ((c, self._cut.pop(c)) for c in order if c in self._cut)
        for c, resume in turns():
            col = self.columns[c]
            if met is not None:     # (a cut walk resumes whatever the answer's rank)
                if not (col.plans_quickly and (col.rank == met.rank or resume
                                               or met.rank in col.walked_after)):
                    continue
            elif best is not None and not col.plans_quickly:
                continue
            if not col.plans_quickly and not skipped_filled:
                skipped_filled = True
                if self.fill_skipped(limit):
                    best = met = self.best_under(limit)
                    continue
            if self.walk(c, limit, math.inf if best is None else best.extra_flops, resume):
                best = met = self.best_under(limit)
            elif best is not None and best.column == col.name:
                met = best      # its own plan, known from before: as if it met it
        if best is None:
            self.fill(limit)
        elif any(c.name == best.column and not c.plans_quickly for c in self.columns):
            for c, col in enumerate(self.columns):      # (step 2d)
                if col.last_resort and col.plans_quickly and self.walk(
                        c, limit, best.extra_flops):
                    best = self.best_under(limit)

    @property
    def exhausted(self) -> bool:
        """Whether every rung of every column has been compiled."""
        return len(self._measured) == sum(len(c.rungs) for c in self.columns)

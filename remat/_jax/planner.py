"""The automatic pass's search on a real program: columns that plan, XLA that measures.

This module gives :mod:`remat.core.search` its two callables for one traced
:class:`~remat._jax.program.Program`: each column plans with one algorithm on one
order of the ops (``remat.core.algorithms``), and ``measure`` rewrites the plan
(``rewrite.py``) and compiles it, reading XLA's footprint. Where XLA reads the
plain program lower with its backward convolutions reading their saved operands
late (``pins.py``), every plan reads late too. The frontier of each
program and setting lives for the process (:func:`planner_for`), so asking
``remat.plan`` for 0.5 and then 0.6 of the same program reuses every compile.
The plain program is compiled with its equations named (:mod:`remat._jax.xla_fusion`):
for a limit no plan meets, the first order is planned on again where the ops whose
results XLA never stored (computed again in each fusion reading them) hold no bytes.
Measuring compiles run on worker threads (:mod:`remat._jax.measuring`): the
plain program's while the orders are simulated, and on CPU beside it the first
column's start for the limit asked (its rung found by the model's figure of the
plain program, XLA's not known yet), and the frontier's next plan beside the
one the search waits for.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import time
from typing import Any

from remat._jax.compat import core
from remat._jax.lowering import default_strategy, fallback_strategy
from remat._jax.measuring import Measured, Measuring, cores
from remat._jax.pins import pin_late_reads
from remat._jax.portfolio import LAST_RESORT, algorithms, laid_out
from remat._jax.program import Program
from remat._jax.rewrite import rewrite_jaxpr
from remat._jax.sharding import keep_output_shardings, value_shardings
from remat._jax.to_graph import jaxpr_to_graph
from remat._jax.xla_figures import XlaFootprint, single_platform
from remat._jax.xla_fusion import as_xla_fused, tag_equations
from remat.core.algorithms import PlanResult, get_algorithm
from remat.core.column_plans import ColumnPlans
from remat.core.gc_pause import gc_paused
from remat.core.options import RematOptions
from remat.core.scheduled import Scheduled, on_schedule
from remat.core.schedulers import get_scheduler
from remat.core.schedulers.best import ranked_schedules
from remat.core.columns import Candidate, Column, Point
from remat.core.search import Frontier
from remat.core.simulate import Timeline

__all__ = ["Planner", "planner_for", "forget_planners"]

#: Frontiers kept for the process (the least recently used one goes first).
_CACHED_PROGRAMS = 8


class Planner:
    """The frontier of one program under one setting, with what the answers need.

    Attributes:
      program: the traced program.
      options: the settings (``algorithm``, ``scheduler``, small-node limit, ...).
      baseline: XLA's footprint of the program as written.
      plain: XLA's footprint of the program plans start from: the baseline,
        or where the user's checkpoint regions were dissolved
        (``Program.as_written``), the program without them (the program as
        written is then a point of the frontier, its recompute counted).
      reads_late: whether every plan's convolutions read late
        (:mod:`remat._jax.pins`; decided at the first limit below the plain
        program's).
      reference: XLA's footprint the columns' estimates convert by (the
        plain program's, or its reading late).
      frontier: the search's points (:class:`remat.core.search.Frontier`).
      fused: the frontier of the first order as XLA fused the plain program,
        asked where ``frontier`` refuses having tried every rung (None until
        then, and where XLA fused as guessed).
      orders: the orders planned on, each with its simulation and what the
        plans on it share (a :class:`~remat.core.scheduled.Scheduled`).
      plan_seconds, compile_seconds: time spent planning and rewriting, and in
        XLA's compiles (the plain program's included), since the planner was made.
      answers: how many limits it has answered.
    """

    def __init__(self, program: Program, options: RematOptions):
        self.program, self.options = program, options
        self._seconds = self.compile_seconds = 0.0   # (planning: see plan_seconds)
        self.answers = 0     # limits answered so far
        # compiles started beside the planning, by key: the plain program's while
        # the orders are simulated, the plans' ahead of the search
        self._measuring = Measuring(program)
        t = time.perf_counter()
        self._measuring.start((), tag_equations(program.flat))
        # the plain program reading late too, if it runs on one device of a
        # platform whose lowering gates (checked again once compiled)
        plain_jaxpr = program.flat.jaxpr
        late = (pin_late_reads(plain_jaxpr) if _gates(program.platform())
                and not _spread(program) else plain_jaxpr)
        if late is not plain_jaxpr:
            self._measuring.start(("reading late",),
                                  core.ClosedJaxpr(late, program.flat.consts))
        self.compile_seconds += time.perf_counter() - t
        start = time.perf_counter()
        graph = program.graph
        with gc_paused():
            if options.scheduler == "best":
                self.orders: list[Scheduled] = [
                    on_schedule(graph, order, timeline=timeline, check=False)
                    for order, timeline in ranked_schedules(graph)]
            else:
                order = get_scheduler(options.scheduler)(graph)
                self.orders = [on_schedule(graph, order, check=False)]
            planned_nothing = self._plain_result()
        self._seconds += time.perf_counter() - start
        self.plans = ColumnPlans(self.orders, options)
        self.reads_late = False     # (decided at the first limit below the plain's)
        # each value's sharding, on several devices (regions' results carry it)
        self.placed = value_shardings(program.flat.jaxpr, program.specs)
        if (late is plain_jaxpr and options.memory_limit is not None
                and program.measures_in_part and cores() > 1 and not _spread(program)):
            self._start_guessed(options.memory_limit)
        t = time.perf_counter()
        lowered, compiled, self.plain = self._measuring.take(())
        self.baseline = self.plain
        # Plans return their results laid out as the plain program does (a plan
        # lowered before this is lowered again).
        kept = keep_output_shardings(compiled, program.jit_kwargs)
        if kept.get("out_shardings") is not program.jit_kwargs.get("out_shardings"):
            self._measuring.drop()
        program.jit_kwargs = kept
        # the plain program's compile, until read for the order as XLA fused it
        self._fused_from, self.fused = compiled, None
        self._xla_fused: int | None = None      # (that order's index, once added)
        written = None
        if program.as_written is not None:    # the user's own checkpoints: a point
            written = Measured.of(program, planned_nothing, program.as_written, 0)
            self.baseline = written.footprint
        self.compile_seconds += time.perf_counter() - t
        start = time.perf_counter()     # the columns (floors, rungs): planning too
        # Where the platform's default lowering gates regions (its convolutions
        # then read late), the plans' other convolutions may read late too: decided
        # by XLA's figure of the plain program so rewritten, at the first limit
        # below the plain program's (see _decide_reading_late).
        platform = single_platform(compiled)
        if not _gates(platform):
            late = plain_jaxpr
        elif late is plain_jaxpr:
            late = pin_late_reads(plain_jaxpr)
        # the plain program reading late, until compiled (None: nothing to decide)
        self._undecided_late = late if late is not plain_jaxpr else None
        self.reference = self.plain        # what the columns' estimates convert by
        self._other_compiles = 0           # besides the plans' (the reading-late one)
        # the columns (portfolio.py), under both lowerings where the platform
        # has two; the order as XLA fused has a frontier of its own (_fused_frontier)
        fallback = platform and fallback_strategy(platform, program.flat.jaxpr)
        if fallback == "gate" and _spread(program):
            fallback = None    # partitioned, gated plans read as the plain program
        columns = laid_out(self._column, self.algorithms(), len(self.orders), fallback,
                           lambda: self.frontier.points, self._whole)   # (made below)
        final = not program.measures_in_part
        plain = Point((), self.plain.total, 0.0, "plain",
                      Measured(planned_nothing, program.flat,
                               compiled if final else None, self.plain, 0, final,
                               None if final else lowered))
        # Plans compile ahead only where a measuring compile is a partial one
        # that keeps one core busy (CPU), and a second core is free: elsewhere it
        # is the full compile, which takes every core, and on a GPU autotunes on
        # the device the user's arrays fill.
        ahead = program.measures_in_part and cores() > 1
        self._ahead = self._compile_ahead if ahead else None
        self.frontier = Frontier(columns, self._measure, plain, compile_ahead=self._ahead)
        if written is not None:
            self._other_compiles += 1
            self.frontier.update(Point(("as written",), written.footprint.total,
                                       self._own_flops(), "as written", written))
        self._seconds += time.perf_counter() - start

    def _start_guessed(self, memory_limit: int | float) -> None:
        """Starts, beside the plain program's measuring compile, the compile the
        search likely asks for first: the first column's start for
        ``memory_limit``, found with the model's figure of the plain program in
        place of XLA's (not known yet). Where the two disagree enough to start
        elsewhere, this compile is dropped unread (``Measuring``)."""
        start = time.perf_counter()
        algorithm = self.algorithms()[0]
        if algorithm in LAST_RESORT:         # (a plan may take longer than a compile)
            return
        argument, output, alias = self.program.held_bytes()
        peak = self.orders[0].timeline.peak_bytes
        if peak <= argument + output - alias:
            return
        guess = XlaFootprint(argument, output, peak - argument - output + alias, alias)
        limit = guess.limit_bytes(memory_limit)
        if limit >= peak:                    # the plain program answers
            return
        targets = self.plans.rungs(algorithm, 0)   # (a limit's estimate: itself)
        self._seconds += time.perf_counter() - start
        self._compile_ahead(self.plans.of(algorithm, 0)(
            targets[max(bisect.bisect_right(targets, limit) - 1, 0)]))

    def _fused_frontier(self) -> Frontier | None:
        """The frontier of the first order on the graph as XLA fused the plain
        program (:func:`~remat._jax.xla_fusion.as_xla_fused`), made when first
        asked for; None where that fuses as guessed. Asked only for limits the
        first frontier refuses with every rung at or below them compiled
        (fusing in the model what XLA fused in the plain program, its plans may
        misjudge what XLA fuses in them); its answers join the first frontier."""
        if self._fused_from is None:
            return self.fused
        start = time.perf_counter()
        graph = as_xla_fused(self.program.graph, self._fused_from)
        self._fused_from = None
        if graph is not self.program.graph:
            self.orders.append(on_schedule(graph, self.orders[0].schedule, check=False))
            self.plans.add_order(self.orders[-1])
            self._xla_fused = len(self.orders) - 1
            self.fused = Frontier([self._column(name, self._xla_fused)
                                   for name in self.algorithms()], self._measure,
                                  self.frontier.plain, compile_ahead=self._ahead)
        self._seconds += time.perf_counter() - start
        return self.fused

    def _decide_reading_late(self) -> None:
        """Compiles the plain program with its convolutions reading late
        (:mod:`remat._jax.pins`); if XLA reads it below the program as written,
        every plan reads late too, the columns convert limits by its figure, and
        it is a point of the frontier (no recompute)."""
        if self._undecided_late is None:
            return
        start = time.perf_counter()
        jaxpr = core.ClosedJaxpr(self._undecided_late, self.program.flat.consts)
        self._undecided_late = None
        measured = self._measuring.measured(
            ("reading late",), self.frontier.plain.payload.result, jaxpr, 0)
        self.compile_seconds += time.perf_counter() - start
        self._other_compiles += 1
        if measured.footprint.total < self.plain.total:
            self.reads_late, self.reference = True, measured.footprint
            self.frontier.update(Point(("reading late",), measured.footprint.total, 0.0,
                                       "plain, reading late", measured))

    @property
    def plan_seconds(self) -> float:
        """Seconds spent planning and rewriting since the planner was made."""
        return self._seconds + self.plans.seconds

    @property
    def compiles(self) -> int:
        """Programs compiled to measure, the plain one aside (the plans', and the
        plain program reading late)."""
        fused = self.fused.compiles if self.fused is not None else 0
        return self.frontier.compiles + fused + self._other_compiles

    def lowest(self) -> Point | None:
        """The point of the least footprint known (of either frontier), compiled
        to run: a limit at its footprint is met (a measuring compile may read a
        plan a few bytes apart from the compile that runs it)."""
        while True:
            points = [f.lowest() for f in (self.frontier, self.fused) if f is not None]
            point = min((p for p in points if p is not None),
                        key=lambda p: (p.footprint, p.extra_flops), default=None)
            if point is None or point.payload.final:
                return point
            self._measuring.drop()
            self._compiled_to_run(point)

    def algorithms(self) -> tuple[str, ...]:
        """The algorithms planned with: the one chosen, or the default's."""
        return algorithms(self.options, self.program.graph.num_ops)

    def answer(self, limit: int) -> Point | None:
        """The cheapest point within ``limit`` (XLA bytes), searching as deep as
        needed; None if no plan of the frontier is within it, or at once if the
        limit is below what any program with these arguments and outputs holds."""
        self.answers += 1
        if limit < self.baseline.held_whatever:
            return None
        if limit < self.plain.total:
            self._decide_reading_late()
        try:
            while True:
                point = self.frontier.answer(limit)
                if (point is None and not self.frontier.out_of_compiles
                        and self._fused_frontier() is not None):
                    point = self.fused.answer(limit)
                    if point is not None:       # (the cheapest known, from now on)
                        self.frontier.update(point)
                if point is None or point.payload.final:
                    return point
                self._measuring.drop()      # (the full compile takes every core)
                point = self._compiled_to_run(point)
                if point.footprint <= limit:
                    return point
        finally:
            self._measuring.drop()          # compiles ahead the search did not read

    def _compiled_to_run(self, point: Point) -> Point:
        """``point`` compiled in full (measuring compiles skip work, and may read
        a plan a few kilobytes apart); the frontier keeps this compile's figure,
        should it differ from the measured one."""
        m = point.payload
        start = time.perf_counter()
        compiled = self.program.compile_lowered(m.lowered)
        footprint = XlaFootprint.of(compiled)
        self.compile_seconds += time.perf_counter() - start
        payload = dataclasses.replace(m, compiled=compiled, footprint=footprint,
                                      final=True, lowered=None)
        final = dataclasses.replace(point, footprint=footprint.total, payload=payload)
        self.frontier.update(final)
        if self.fused is not None and final.key in self.fused.points:
            self.fused.update(final)
        return final

    # ---------------------------------------------------------------- columns

    def _column(self, algorithm: str, order: int) -> Column:
        peak = self.orders[order].timeline.peak_bytes
        # converts misses; starts from the estimate below, which follows the reference
        per_xla = peak / max(self.plain.total - self.plain.scratch, 1)
        name = algorithm if len(self.orders) == 1 else f"{algorithm}/order {order}"
        if order == self._xla_fused:
            name = f"{algorithm}/order 0, as XLA fused"

        def estimate(limit: int) -> int:     # the reference's model bytes per XLA byte
            ref = self.reference
            return int(max(limit - ref.scratch, 0) * peak / max(ref.total - ref.scratch, 1))

        return Column(name, self.plans.rungs(algorithm, order), per_xla, estimate,
                      self.plans.of(algorithm, order),
                      rank=2 * order, plans_quickly=algorithm not in LAST_RESORT)

    def _whole(self, order: int) -> Column:
        """``"segments"``' column on ``order``, its plans realized whole
        (``ColumnPlans.whole``)."""
        col = self._column("segments", order)
        return dataclasses.replace(col, name=f"{col.name} (whole)",
                                   plan=self.plans.whole(order),
                                   twin_of=col.name)

    def _measure(self, cand: Candidate) -> Point:
        result, small, _ = cand.payload
        self._compile_ahead(cand)           # (unless started ahead already)
        t = time.perf_counter()
        measured = self._measuring.measured(cand.key, result, None, small)
        self.compile_seconds += time.perf_counter() - t
        return Point(cand.key, measured.footprint.total, cand.extra_flops, "", measured)

    def _compile_ahead(self, cand: Candidate) -> None:
        """Rewrites ``cand``'s plan and starts its measuring compile on a worker
        (the frontier's ``compile_ahead``; :meth:`_measure` reads it)."""
        if self._measuring.started(cand.key):
            return
        result, _, lowering = cand.payload
        start = time.perf_counter()
        with gc_paused():
            flat = self.program.flat
            jaxpr = rewrite_jaxpr(flat.jaxpr, result.rewritten, lowering, self.placed)
            if self.reads_late:
                jaxpr = pin_late_reads(jaxpr)
            jaxpr = core.ClosedJaxpr(jaxpr, flat.consts)
        self._seconds += time.perf_counter() - start
        t = time.perf_counter()
        self._measuring.start(cand.key, jaxpr)
        self.compile_seconds += time.perf_counter() - t

    def _plain_result(self) -> PlanResult:
        """The result of planning nothing (the program as written)."""
        scheduled = self.orders[0]
        options = dataclasses.replace(self.options,
                                      model_target_bytes=scheduled.timeline.peak_bytes,
                                      algorithm="path", small_node_bytes=0)
        return get_algorithm("path")(scheduled, options)

    def _own_flops(self) -> float:
        """The FLOPs the user's own checkpoint regions recompute: those of the
        program as written, regions inlined, less the flat program's (in the
        units of the planning graph, whose FLOPs are one device's)."""
        def flops(closed):
            return sum(op.flops for op in jaxpr_to_graph(closed).ops)
        flat = flops(self.program.flat)
        per_device = sum(op.flops for op in self.program.graph.ops) / max(flat, 1.0)
        return max(flops(self.program.as_written) - flat, 0.0) * per_device

    def model_timeline(self) -> Timeline:
        """The simulation of the program as written, on the first order."""
        return self.orders[0].timeline


def _gates(platform: str | None) -> bool:
    """Whether the default lowering gates regions on ``platform``."""
    return platform is not None and default_strategy(platform) == "gate"


def _spread(program: Program) -> bool:
    """Whether ``program``'s inputs are placed on several devices."""
    return any(len(getattr(s, "device_set", ())) > 1 for s in program.in_shardings)


_PLANNERS: collections.OrderedDict[Any, Planner] = collections.OrderedDict()


def planner_for(program: Program, options: RematOptions) -> Planner:
    """The planner of ``program`` under ``options``, kept for the process: a
    program traced again with the same structure, constants and call reuses it."""
    key = (program.key, options.algorithm, options.scheduler, options.small_node_bytes,
           options.small_node_given, options.solver_seconds, options.max_chain_ops)
    planner = _PLANNERS.pop(key, None)
    if planner is None:
        planner = Planner(program, options)
    _PLANNERS[key] = planner
    while len(_PLANNERS) > _CACHED_PROGRAMS:
        _PLANNERS.popitem(last=False)
    return planner


def forget_planners() -> None:
    """Drops every kept frontier (for tests and benchmarks that time a first call)."""
    _PLANNERS.clear()

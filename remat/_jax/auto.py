"""The automatic pass: ``remat.plan`` and ``remat.jit``.

Trace the whole program (a loss, its gradient, a train step), flatten it
(``inline.py``), convert it to a planning graph, let an algorithm of
``remat.core.algorithms`` choose regions to recompute under the limit, emit the
rewritten jaxpr (``rewrite.py``: each region one opaque ``remat_p`` equation), then
compile it and check XLA's own footprint figure. If XLA needs more than the limit,
the planning limit is tightened in proportion and planning runs again; if the
limit cannot be met, :class:`MemoryLimitError` says by how much.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax

from remat._flags import flags_from_env
from remat._jax.compat import core
from remat._jax.inline import inline_calls
from remat._jax.rewrite import rewrite_jaxpr
from remat._jax.to_graph import jaxpr_to_graph
from remat.core.algorithms import (PlanResult, consolidated, get_algorithm,
                                   may_recompute)
from remat.core.algorithms.optimal import OptimalResult
from remat.core.dot import to_dot
from remat.core.gc_pause import gc_paused
from remat.core.graph import Graph
from remat.core.memlog import format_bytes, memlog
from remat.core.bounds import planner_floor
from remat.core.options import DEFAULT_SMALL_NODE_BYTES, RematOptions, parse_bytes
from remat.core.schedulers import get_scheduler
from remat.core.schedulers.best import ranked_schedules
from remat.core.simulate import simulate

log = logging.getLogger("remat")

_RETRIES = 5        # plans per order aiming lower after XLA's misses
_REFINES = 3        # plans bisecting back towards the limit after an overshoot
_MAX_ATTEMPTS = 10  # plans (and compiles) in all, besides the bisecting ones
_NEIGHBOURS = 4     # plans just above the floor, when XLA reads the floor's a near miss
#: How far apart (a fraction of the temporaries) the targets above the floor are.
_NEIGHBOUR_STEP = 0.0025


class MemoryLimitError(ValueError):
    """The memory limit cannot be met by rematerialization."""


# A library call's workspace in optimized HLO: a byte array in the result tuple of
# a custom call (cuBLAS and cuDNN calls on GPU: ``(f32[...], s8[33554432]) custom-call``).
_CUSTOM_CALL = re.compile(r"= \((.*)\) custom-call\(")
_BYTE_ARRAY = re.compile(r"\b[su]8\[(\d+)\]")


def library_scratch_bytes(hlo_text: str) -> int:
    """The largest workspace a library call of an optimized HLO module asks for.

    XLA:GPU gives each cuBLAS/cuDNN call a scratch buffer (32 MiB per matmul on
    Hopper) and counts it in the temporaries; the calls run one at a time and share
    it, and no rematerialization makes it smaller.

    >>> library_scratch_bytes("%c = (f32[8]{0}, s8[1024]{0}) custom-call(%a), "
    ...                       'custom_call_target="__cublas$gemm"')
    1024
    """
    return max((int(n) for line in _CUSTOM_CALL.findall(hlo_text)
                for n in _BYTE_ARRAY.findall(line)), default=0)


@dataclasses.dataclass(frozen=True)
class XlaFootprint:
    """XLA's memory figures of a compiled program, in bytes.

    ``scratch`` is the part of ``temp`` that library calls use as workspace
    (:func:`library_scratch_bytes`): fixed whatever is recomputed.
    """
    argument: int
    output: int
    temp: int
    alias: int
    scratch: int = 0

    @property
    def total(self) -> int:
        """What the program needs: arguments + outputs + temporaries - aliased."""
        return self.argument + self.output + self.temp - self.alias

    @property
    def fixed(self) -> int:
        """What no rematerialization changes: arguments, outputs (less aliased
        bytes) and library scratch."""
        return self.argument + self.output - self.alias + self.scratch

    @classmethod
    def of(cls, compiled) -> "XlaFootprint":
        m = compiled.memory_analysis()
        return cls(m.argument_size_in_bytes, m.output_size_in_bytes,
                   m.temp_size_in_bytes, m.alias_size_in_bytes,
                   min(library_scratch_bytes(compiled.as_text()), m.temp_size_in_bytes))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the automatic pass decided for one program, and what XLA made of it.

    Attributes:
      limit_bytes: the footprint asked for.
      baseline: XLA's footprint of the program as written.
      planned: XLA's footprint of the rewritten program.
      result: the planning result (graph level: regions, simulations).
      graph: the planning graph of the program as written.
      jaxpr: the rewritten program.
      plan_seconds: time spent planning and rewriting (not tracing, which
        ``jax.jit`` does too, nor compiling).
      small_node_bytes: the small-node limit planned with (the default is lowered
        when the values it keeps would put the limit out of reach).
      out_tree: the structure of the program's outputs.
      compiled: the compiled rewritten program.
    """
    limit_bytes: int
    baseline: XlaFootprint
    planned: XlaFootprint
    result: PlanResult
    graph: Graph
    jaxpr: core.ClosedJaxpr
    plan_seconds: float
    out_tree: Any = dataclasses.field(repr=False, default=None)
    compiled: Any = dataclasses.field(repr=False, default=None)
    small_node_bytes: int = DEFAULT_SMALL_NODE_BYTES

    @property
    def met(self) -> bool:
        return self.planned.total <= self.limit_bytes

    @property
    def extra_flops(self) -> float:
        """FLOPs of the recomputations (our estimate)."""
        return self.result.extra_flops

    @property
    def recomputed(self) -> list[str]:
        """One line per recomputed op: its label and source line."""
        g = self.graph
        return [f"{g.ops[o].label} from {g.ops[o].source or 'unknown source'}"
                for r in self.result.regions for o in r.recompute]

    def memlog(self) -> str:
        """The memory log of the rewritten program, with the remat decisions."""
        rw = self.result.rewritten
        decisions = {o: ("recompute" if rw.is_copy[o] else
                         f"region {rw.region[o]}" if rw.region[o] >= 0 else "")
                     for o in range(len(rw.origin))}
        return memlog(rw.graph, self.result.timeline, decisions)

    def to_dot(self, after: bool = True) -> str:
        """DOT of the program after (default) or before the rewrite; recomputed ops
        are highlighted."""
        rw = self.result.rewritten
        if not after:
            return to_dot(self.graph, self.result.baseline)
        return to_dot(rw.graph, self.result.timeline,
                      frozenset(o for o, c in enumerate(rw.is_copy) if c))

    def plot(self, path: str | os.PathLike) -> None:
        """A PNG of live bytes per step, before and after, with the limit."""
        from remat.core.plot import plot_timeline   # matplotlib is imported lazily
        rw = self.result.rewritten
        plot_timeline(rw.graph, self.result.timeline, path,
                      title="after rematerialization", limit_bytes=self.limit_bytes,
                      recomputed=frozenset(o for o, c in enumerate(rw.is_copy) if c))

    def __str__(self) -> str:
        return (f"remat plan: limit {format_bytes(self.limit_bytes)}, XLA footprint "
                f"{format_bytes(self.baseline.total)} -> {format_bytes(self.planned.total)}"
                f" ({'met' if self.met else 'NOT met'}), {len(self.result.regions)} "
                f"region(s), {len(self.recomputed)} recomputed op(s), "
                f"+{self.extra_flops / 1e9:.2f} GFLOP, planned in {self.plan_seconds:.2f} s")


# --------------------------------------------------------------------- settings

@dataclasses.dataclass(frozen=True)
class _Settings:
    memory_limit: Any
    algorithm: str
    scheduler: str
    small_node_bytes: int
    dump_to: str | None
    dump_dot: bool
    dump_memlog: bool
    solver_seconds: float = 60.0    # "optimal"'s time limit (REMAT_FLAGS only)
    small_node_given: bool = False  # False: the default, lowered when it blocks the limit


_UNSET: Any = object()


def _settings(memory_limit, algorithm, scheduler, small_node_limit, dump_to
              ) -> _Settings:
    """Explicit arguments win; unset ones come from REMAT_FLAGS, then defaults."""
    env = flags_from_env()
    pick = lambda given, key, default: (given if given is not _UNSET
                                        else env.get(key, default))
    limit = pick(memory_limit, "memory_limit", None)
    if limit is None:
        raise ValueError("remat: no memory limit; pass memory_limit= (bytes, a size "
                         "such as '2GiB', or a fraction in (0, 1] of the plain "
                         "program's temporaries) or set REMAT_FLAGS=--memory_limit=...")
    dump_to = pick(dump_to, "dump_to", None)
    chosen = {k for k in ("dump_dot", "dump_memlog") if env.get(k)}
    if chosen and not dump_to:
        raise ValueError(f"REMAT_FLAGS: --{' --'.join(sorted(chosen))} needs a directory: "
                         "add --dump_to=DIR (or pass dump_to=).")
    return _Settings(
        _parse_limit(limit), pick(algorithm, "algorithm", "path"),
        pick(scheduler, "scheduler", "best"),
        parse_bytes(pick(small_node_limit, "small_node_limit",
                         DEFAULT_SMALL_NODE_BYTES)),
        dump_to, not chosen or "dump_dot" in chosen,
        not chosen or "dump_memlog" in chosen,
        float(env.get("solver_seconds", 60.0)),
        small_node_limit is not _UNSET or "small_node_limit" in env)


def _parse_limit(limit) -> int | float:
    """Bytes (an int or a size string), or a fraction (a float, or a string such
    as ``"0.5"``) of the plain program's temporaries."""
    if isinstance(limit, str):
        try:
            value = float(limit)
        except ValueError:
            return parse_bytes(limit)
        limit = value if "." in limit or "e" in limit.lower() else int(value)
    if isinstance(limit, float):
        if not 0 < limit <= 1:
            raise ValueError(f"remat: a fractional memory_limit must be in (0, 1], got "
                             f"{limit!r}; give bytes as an int or a size like '2GiB'.")
        return limit
    return parse_bytes(limit)


# --------------------------------------------------------------------- planning

def _trace(fun, args, kwargs):
    flat_args, in_tree = jax.tree_util.tree_flatten((args, kwargs))

    def flat_fun(*flat):
        a, k = jax.tree_util.tree_unflatten(in_tree, flat)
        return fun(*a, **k)

    closed, out_shape = jax.make_jaxpr(flat_fun, return_shape=True)(*flat_args)
    return closed, jax.tree_util.tree_structure(out_shape)


def _as_function(closed: core.ClosedJaxpr, out_tree) -> Callable:
    """The program ``closed`` as a function of the original (args, kwargs)
    structure, so that ``jit_kwargs`` such as ``donate_argnums`` keep their meaning."""
    def run(*args, **kwargs):
        outs = core.jaxpr_as_fun(closed)(*jax.tree_util.tree_leaves((args, kwargs)))
        return jax.tree_util.tree_unflatten(out_tree, outs)
    return run


def _compile(closed: core.ClosedJaxpr, out_tree, args, kwargs, jit_kwargs):
    return jax.jit(_as_function(closed, out_tree), **jit_kwargs).lower(
        *args, **kwargs).compile()


def _graph_of(flat: core.ClosedJaxpr) -> Graph:
    """The planning graph of a flat jaxpr: op ``i`` is equation ``i``."""
    graph = jaxpr_to_graph(flat)
    labels = [e.primitive.name for e in flat.jaxpr.eqns]
    if [op.label for op in graph.ops] != labels:
        raise AssertionError("remat internal error: the planning graph does not match "
                             "the flattened program equation for equation.")
    return graph


def _lower_bound(graph: Graph) -> int:
    """No schedule needs less: inputs, outputs, and the largest op's operands and
    results together."""
    base = simulate(graph, tuple(range(graph.num_ops)), check=False)
    fixed = base.input_bytes + base.output_bytes
    largest = max((sum(graph.values[v].nbytes for v in set(op.inputs + op.outputs)
                       if v not in graph.inputs and v not in graph.outputs)
                   for op in graph.ops), default=0)
    return fixed + largest


def _in_xla_bytes(model_bytes: int, timeline, baseline: XlaFootprint) -> int:
    """A footprint of our model in XLA's terms: arguments, outputs and library
    scratch as XLA counts them, temporaries scaled by how XLA's plain program
    compares with the model's (on the order ``timeline`` is for)."""
    fixed = timeline.input_bytes + timeline.output_bytes
    temps = max(timeline.peak_bytes - fixed, 1)
    return int(baseline.fixed +
               max(model_bytes - fixed, 0) * (baseline.temp - baseline.scratch) / temps)


def _limit_bytes(limit: int | float, baseline: XlaFootprint) -> int:
    """The limit in bytes: as given, or for a fraction, the plain program's fixed
    bytes plus that fraction of the temporaries that recomputation can shrink."""
    if isinstance(limit, float):
        return int(baseline.fixed + limit * (baseline.temp - baseline.scratch))
    return limit


def _small_node_bytes(floor: Callable[[int], int], target: int, settings: _Settings,
                      cap: int) -> int:
    """The small-node limit to plan with: the one given, or the default (at most
    ``cap``), halved until the values it keeps no longer put the target out of
    reach (``floor``: the planner's floor for a small-node limit)."""
    if settings.small_node_given:
        return settings.small_node_bytes
    small = min(settings.small_node_bytes, cap)
    while small > 4096 and floor(small) > target:
        small //= 2
    return small if floor(small) <= target else 0


def _schedules(graph: Graph, name: str) -> list[tuple[int, ...]]:
    """The orders to plan on, in turn. ``"best"``: the candidates' distinct orders,
    lowest simulated peak first. XLA reorders whatever the regions leave free, and
    how well a plan survives that depends on the order it was made for (ResNet-50
    at 50%: plans made on the list order meet the limit with a few percent more
    FLOPs; those made on the lowest-peak order miss it)."""
    if name != "best":
        return [get_scheduler(name)(graph)]
    return [schedule for schedule, _ in ranked_schedules(graph)]


#: A plan XLA reads over the limit by at most this fraction is a near miss.
_NEAR_MISS = 0.05
#: A met plan recomputing this many times a near miss's FLOPs is worth bisecting.
_COST_JUMP = 2.0


def _costly(met: list, near) -> bool:
    """Whether the cheapest met plan recomputes ``_COST_JUMP`` times the FLOPs of
    the near miss ``near`` (``(target, plan)`` or None). On XLA:GPU the 12-layer
    chain at 30% went from a 122 GFLOP plan 3% over the limit to a 522 GFLOP plan
    under it (7x the step time) in one retry."""
    if not met or near is None:
        return False
    # A near miss recomputing (almost) nothing makes no met plan costly by itself.
    return min(p.extra_flops for p in met) > _COST_JUMP * (near[1].extra_flops + 1e6)


def _missed(target: int, plan: Plan) -> int:
    """Where a plan that XLA read over the limit leaves the bisection interval:
    the target it was planned for, or the peak the planner reached if lower (any
    target between the two gives the same plan)."""
    return min(target, plan.result.timeline.peak_bytes)


@dataclasses.dataclass
class _Search:
    """The plans tried for one program, each planned on one order, rewritten,
    compiled and read back in XLA's figures (at most ``_MAX_ATTEMPTS``, and
    ``_REFINES`` more to bisect).

    On each order the planning target starts at the limit in model units. While
    XLA misses the limit the target drops by the miss (from the missed plan's
    model peak, if below its target), by more each attempt and after each attempt
    that did not lower XLA's figure, but not below the floor of the small-node
    limit in use while above it. Once a plan meets it with room to spare (aiming
    lower overshot), the target is bisected between that plan and the last miss,
    up to ``_REFINES`` times, until a plan repeats, or until XLA reads a
    bisecting plan over the missed one, since a plan nearer the limit recomputes
    less; and so it is, from the near miss, when a met plan without such room
    recomputes over ``_COST_JUMP`` times the FLOPs of a plan XLA read at most
    ``_NEAR_MISS`` over the limit (see :func:`_costly`). A plan with the regions
    of one tried before is not compiled again. Where the planner's floor stops
    an order at a plan XLA reads a near miss and nothing met the limit, the plans
    just above the floor are tried (:meth:`above_floor`). The first order with a met plan
    ends the search (which order goes on when: :func:`_search_orders`); the met
    plan with the least recompute is the answer.
    """
    flat: core.ClosedJaxpr
    graph: Graph
    out_tree: Any
    call: tuple           # (args, kwargs, jit_kwargs) to compile with
    settings: _Settings
    baseline: XlaFootprint
    limit: int
    start: float          # when planning began (perf_counter)
    compiling: float = 0.0   # seconds spent in XLA's compiles since then
    attempts: int = 0
    met: list = dataclasses.field(default_factory=list)
    lowest: Plan | None = None     # the plan with the least XLA footprint
    floors: list = dataclasses.field(default_factory=list)
    known_floors: dict = dataclasses.field(default_factory=dict)
    tried: dict = dataclasses.field(default_factory=dict)   # regions -> Plan

    def try_plan(self, schedule, target: int, small: int,
                 first: bool = False) -> Plan | None:
        """One attempt: plans for ``target`` (model bytes) on ``schedule``, and keeps
        the tally of met and lowest plans. None if this is an order's ``first``
        attempt and its plan is one an earlier order already gave (XLA read it then)."""
        plan = self.compiled_plan(schedule, target, small, first)
        if plan is None:
            log.debug("remat: the plan for target %d on this order is one tried on an "
                      "earlier order; next order", target)
            return None
        self.attempts += 1
        log.debug("remat: attempt %d: target %d (model), small %d, model peak %d, XLA "
                  "%d, limit %d, %d region(s), +%.2f GFLOP; planning so far %.2f s",
                  self.attempts, target, small, plan.result.timeline.peak_bytes,
                  plan.planned.total, self.limit, len(plan.result.regions),
                  plan.extra_flops / 1e9, self.planning_seconds())
        if plan.met and not any(plan is p for p in self.met):   # a repeated plan
            self.met.append(plan)
        if self.lowest is None or plan.planned.total < self.lowest.planned.total:
            self.lowest = plan
        return plan

    def compiled_plan(self, schedule, target: int, small: int,
                      first: bool = False) -> Plan | None:
        """Plans for ``target``, rewrites, compiles: the plan with XLA's figures. A
        plan with the regions of one compiled before is not compiled again: the
        earlier plan, or None on an order's ``first`` attempt (see :meth:`try_plan`)."""
        s = self.settings
        options = RematOptions(target, s.algorithm, s.scheduler, small,
                               solver_seconds=s.solver_seconds)
        with gc_paused():
            result = get_algorithm(s.algorithm)(self.graph, schedule, options)
        if result.regions in self.tried:
            return None if first else self.tried[result.regions]
        return self.compiled(result, small)

    def compiled(self, result: PlanResult, small: int) -> Plan:
        """``result`` rewritten and compiled: the plan with XLA's figures."""
        with gc_paused():
            rewritten = core.ClosedJaxpr(rewrite_jaxpr(self.flat.jaxpr, result.rewritten),
                                         self.flat.consts)
        t = time.perf_counter()
        compiled = _compile(rewritten, self.out_tree, *self.call)
        footprint = XlaFootprint.of(compiled)
        self.compiling += time.perf_counter() - t
        plan = Plan(self.limit, self.baseline, footprint, result, self.graph, rewritten,
                    self.planning_seconds(), self.out_tree, compiled, small)
        self.tried[result.regions] = plan
        return plan

    def consolidate_met(self, plan: Plan) -> Plan:
        """``plan``, met in XLA's figures though it missed its target in the model,
        with its regions merged within its own simulated peak (the planner merges
        regions only within the target, so such a plan kept every rebuild): the
        same peak for less recompute (U-Net ``standard`` at 30%: 9.4 instead of 46.7
        extra GFLOP). That plan if XLA reads it within the limit too, else ``plan``."""
        if plan.result.met or self.settings.algorithm == "optimal":
            return plan
        schedule = plan.result.baseline.schedule
        with gc_paused():
            merged = consolidated(self.graph, schedule, plan.result,
                                  plan.result.timeline.peak_bytes)
        if merged is plan.result:
            return plan
        better = self.tried.get(merged.regions) or self.compiled(merged,
                                                                 plan.small_node_bytes)
        log.debug("remat: the chosen plan, consolidated within its peak: +%.2f GFLOP "
                  "(was +%.2f), XLA %d", better.extra_flops / 1e9, plan.extra_flops / 1e9,
                  better.planned.total)
        return better if better.met and better.extra_flops < plan.extra_flops else plan

    def planning_seconds(self) -> float:
        """Seconds since planning began, less XLA's compiles."""
        return time.perf_counter() - self.start - self.compiling

    def floor(self, timeline, small: int) -> int:
        """The planner's floor on ``timeline``'s order with small-node limit
        ``small`` (:func:`planner_floor`), worked out once."""
        key = (timeline.schedule, small)
        if key not in self.known_floors:
            self.known_floors[key] = planner_floor(
                self.graph, timeline, small, may_recompute(self.settings.algorithm))
        return self.known_floors[key]

    def above_floor(self, schedule, plan: Plan, small: int, temps: int,
                    missed_target: int | None) -> Iterator[Plan]:
        """Up to ``_NEIGHBOURS`` plans other than ``plan``, for targets stepping up
        from its model peak (``_NEIGHBOUR_STEP`` of the temporaries ``temps`` a
        step, below ``missed_target``, the lowest target on this order XLA read
        over the limit), when ``plan``, the plan at the planner's floor, is a near
        miss: until one meets the limit. XLA's best-fit heap packing leaves holes
        that differ from plan to plan: on the small U-Net at 30%, the plans of
        targets from the floor (1,667 KiB) to 1,731 KiB hold 945 to 982 KiB of
        temporaries at once, and XLA's layouts of them take 981 to 1,090 KiB (the
        plan at the floor: 1,076, over the limit; the first above it: 981,
        within; ``python -m bench.bench_heap``). ``"optimal"`` tries none
        (each is a solve; its fallback, the heuristics' searches, do)."""
        if (self.settings.algorithm == "optimal" or self.met or plan.met or
            plan.planned.total > (1 + _NEAR_MISS) * self.limit):
            return
        log.debug("remat: XLA reads the plan at the floor %.1f%% over the limit; "
                  "trying plans just above it", 100 * (plan.planned.total / self.limit - 1))
        step = max(int(_NEIGHBOUR_STEP * temps), 1)
        target = plan.result.timeline.peak_bytes
        seen = {plan.result.regions}
        for _ in range(4 * _NEIGHBOURS):      # targets, some giving a plan seen
            target += step
            if len(seen) > _NEIGHBOURS or (missed_target is not None and
                                           target >= missed_target):
                return
            near = self.try_plan(schedule, target, small)
            if near.result.regions in seen:
                continue
            seen.add(near.result.regions)
            yield near
            if near.met:
                return

    def on_order(self, schedule) -> None:
        """Attempts on one order until a plan meets the limit, the model says the
        limit is out of reach, or the attempts run out."""
        for _ in self.attempts_on(schedule):
            pass

    def attempts_on(self, schedule) -> Iterator[Plan]:
        """:meth:`on_order`, one attempt at a time: yields each plan after it is
        read (none if the order's first plan repeats an earlier order's)."""
        graph, settings, limit = self.graph, self.settings, self.limit
        timeline = simulate(graph, schedule, check=False)
        temps = timeline.peak_bytes - timeline.input_bytes - timeline.output_bytes
        # Plan in our model's units: scale XLA's limit by how our model reads XLA
        # (library scratch, which the model does not see, left out of both).
        to_model = timeline.peak_bytes / max(self.baseline.total - self.baseline.scratch, 1)
        target = max(int((limit - self.baseline.scratch) * to_model), 0)
        cap = settings.small_node_bytes
        stalls = retries = refines = 0
        met_target = missed_target = None
        missed_xla = None    # XLA's figure of the plan planned for missed_target
        lowest_here = None   # the least XLA figure of this order's plans
        seen = []            # this order's plans
        near = None          # (target, plan): the nearest miss within _NEAR_MISS
        while self.attempts < _MAX_ATTEMPTS + (_REFINES if refines else 0):
            small = _small_node_bytes(lambda s: self.floor(timeline, s), target, settings,
                                      cap)
            best_before = lowest_here
            plan = self.try_plan(schedule, target, small, first=lowest_here is None)
            if plan is None:
                return
            yield plan
            lowest_here = min(plan.planned.total, lowest_here or plan.planned.total)
            repeated = any(plan is p for p in seen)
            seen.append(plan)
            if plan.met:
                # Targets below the peak the planner reached give the same plan again.
                met_target = max(target, plan.result.timeline.peak_bytes)
            else:
                if plan.planned.total <= (1 + _NEAR_MISS) * limit and (
                    near is None or plan.planned.total < near[1].planned.total):
                    near = (_missed(target, plan), plan)
                if refines:
                    if plan.planned.total > missed_xla:
                        # XLA reads this plan, planned between a met plan's target and a
                        # missed one's, over the missed one: its figure does not follow the
                        # target here, and bisecting further is a guess (ResNet-50
                        # `standard` at 30%: 254 MB at the missed target, then 280 and 271
                        # MB at two targets between it and the met plan's).
                        return
                    missed_target, missed_xla = _missed(target, plan), plan.planned.total
            if refines or plan.met:
                # Bisect while a met plan leaves room and the interval is worth it,
                # and while bisecting still gives new plans.
                room = (not repeated and met_target is not None and
                        missed_target is not None and
                        missed_target - met_target > 0.01 * temps and
                        max(p.planned.total for p in self.met) < 0.97 * limit)
                if (not room and not refines and plan.met and _costly(self.met, near) and
                    near[0] - met_target > 0.01 * temps):
                    # Aiming lower overshot into a plan that recomputes far more than a
                    # near miss, and no bisection from the last miss is due: bisect from
                    # the near miss.
                    missed_target, missed_xla = near[0], near[1].planned.total
                    room = True
                if not room or refines == _REFINES:
                    return
                refines += 1
                target = (met_target + missed_target) // 2
                continue
            # Missed in the model. (Not ``plan.result.met``: a plan repeated from an
            # earlier attempt carries that attempt's result, judged on its target.)
            if plan.result.timeline.peak_bytes > target:
                floor = self.floor(timeline, small)
                if (small > 0 and not settings.small_node_given and
                    plan.result.timeline.peak_bytes <= floor + 0.1 * temps):
                    cap = small // 4    # the small values bind: the default gives way further
                    continue
                self.floors.append(_in_xla_bytes(floor, timeline, self.baseline))
                # Our model already says the target is out of reach here; but where XLA
                # reads the plan at the floor a near miss, the plans just above it may
                # pack better in XLA's heap.
                yield from self.above_floor(schedule, plan, small, temps, missed_target)
                return
            if retries == _RETRIES:
                return
            # XLA needs more than the model predicted: aim lower by the miss (in model
            # units), by more each time, and half as much again after each attempt
            # that did not lower XLA's figure; by at least 1% of the temporaries
            # (doubled per stall), since a tiny miss aimed at by a tiny step gives the
            # same plan again. A step that overshoots is taken back by bisection.
            stalls += best_before is not None and plan.planned.total >= best_before
            step = (1.0 + 0.5 * retries) * 1.5 ** stalls
            retries += 1
            missed_target, missed_xla = _missed(target, plan), plan.planned.total
            miss = (plan.planned.total - limit) * to_model * step
            lower = max(missed_target - int(max(miss, 0.01 * temps * 2 ** stalls)) - 1, 0)
            # Not below what this small-node limit allows while above it: a target
            # under that floor makes the next plan drop small values too, which costs
            # many times the planning time for a few percent.
            floor = self.floor(timeline, small) if small else 0
            target = lower if target <= floor else max(lower, floor)


def _search_orders(search: _Search, schedules) -> None:
    """Attempts on the orders until a plan meets the limit or the attempts run
    out, the first order first. If XLA reads its first two plans over the limit,
    the second by more than 5%, each other order's first plan is read, and an
    order whose plan XLA reads clearly lower (by 5%) goes on first. How XLA's
    figure compares with the model's depends on the order (ResNet-50 at 50%:
    354 MB for the first two orders' plans, 309 MB for the third's, all planned
    for the same target), and retries on an order XLA reads high cost more than
    one plan on each order; a small miss, though, is mostly XLA's noise.
    """
    runs = [search.attempts_on(schedule) for schedule in schedules]
    going_on = list(range(len(runs)))
    for n, plan in enumerate(runs[0], 1):
        if (n == 2 and not search.met and len(runs) > 1 and
            plan.planned.total > 1.05 * search.limit):
            first_low = search.lowest.planned.total
            probed = sorted((probe.planned.total, i) for i, run in enumerate(runs[1:], 1)
                            if (probe := next(run, None)) is not None)
            going_on = [i for _, i in probed]
            if search.met:              # an order's first plan met: refine on it
                going_on = going_on[:1]
            else:
                going_on.insert(1 if probed and probed[0][0] < 0.95 * first_low else 0, 0)
            break
    for i in going_on:
        for _ in runs[i]:
            pass
        if search.met or search.attempts >= _MAX_ATTEMPTS:
            return


def _heuristics_search(search: _Search, schedules) -> bool:
    """When XLA reads every plan of ``"optimal"``'s search over the limit: the
    searches of ``"path"``, then ``"standard"``, each with its own attempts, until
    one meets it. XLA reads plans of equal simulated peak several percent apart, so
    a search aiming at other targets can meet a limit another missed (U-Net at
    30%: the optimum's search aims where the solver finds no selection in time and
    the heuristic plans it falls back on read 4.5% over; path's own search meets
    it). So ``"optimal"`` meets a limit wherever a heuristic's own search does, as
    it is never worse than theirs at the planner level. True if one met it."""
    optimal = search.settings
    for name in ("path", "standard"):
        log.info("remat: XLA read every plan of the optimal search over the limit; "
                 "trying %r's own search", name)
        search.settings = dataclasses.replace(optimal, algorithm=name)
        search.attempts = 0
        search.tried = {}     # an order ends at a plan tried before: not across searches
        _search_orders(search, schedules)
        if search.met:
            break
    search.settings = optimal
    return bool(search.met)


def plan_program(fun, args, kwargs, settings: _Settings, jit_kwargs) -> Plan:
    from remat._jax.loop_plan import plan_with_loops   # differentiated loops first
    return plan_with_loops(fun, args, kwargs, settings, jit_kwargs, _plan_flat)


def _plan_flat(fun, args, kwargs, settings: _Settings, jit_kwargs) -> Plan:
    closed, out_tree = _trace(fun, args, kwargs)
    start = time.perf_counter()     # tracing is not planning: jax.jit traces too
    with gc_paused():
        flat = inline_calls(closed)
        graph = _graph_of(flat)
        schedules = _schedules(graph, settings.scheduler)
    t = time.perf_counter()
    baseline = XlaFootprint.of(_compile(flat, out_tree, args, kwargs, jit_kwargs))
    limit = _limit_bytes(settings.memory_limit, baseline)
    search = _Search(flat, graph, out_tree, (args, kwargs, jit_kwargs), settings,
                     baseline, limit, start, time.perf_counter() - t)
    _search_orders(search, schedules)
    heuristic = settings.algorithm == "optimal" and not search.met and _heuristics_search(
        search, schedules)
    best = (search.consolidate_met(min(search.met, key=lambda p: p.extra_flops))
            if search.met else search.lowest)
    if heuristic and best.met:
        r = best.result
        best = dataclasses.replace(best, result=OptimalResult(
            r.regions, r.rewritten, r.timeline, r.baseline, r.limit_bytes,
            status="heuristic_search"))
    best = dataclasses.replace(best, plan_seconds=search.planning_seconds())
    _dump(best, settings)
    if not best.met:
        timeline = simulate(graph, schedules[0], check=False)
        allows = may_recompute(settings.algorithm)
        bound = _in_xla_bytes(_lower_bound(graph), timeline, baseline)
        floor = min(search.floors) if search.floors else _in_xla_bytes(
            planner_floor(graph, timeline, best.small_node_bytes, allows), timeline,
            baseline)
        floor = max(floor, bound)    # each is a bound; the pass's is the higher
        raise MemoryLimitError(
            f"remat: cannot meet memory_limit={format_bytes(limit)} ({limit} bytes) "
            f"with algorithm {settings.algorithm!r}. XLA's footprint of the program is "
            f"{format_bytes(baseline.total)}; the least reached is "
            f"{format_bytes(best.planned.total)}. With small_node_limit="
            f"{format_bytes(best.small_node_bytes)}, no plan of this pass goes below "
            f"about {format_bytes(floor)} (the values {settings.algorithm!r} may not "
            "recompute, and each op's operands and results; our model, scaled to XLA's "
            "figures); no rematerialization at "
            f"all goes below about {format_bytes(bound)} "
            "(inputs, outputs and the largest single operation)" + (
                f"; both include {format_bytes(baseline.scratch)} of library scratch "
                "(workspace of cuBLAS/cuDNN calls), which recomputation does not shrink"
                if baseline.scratch else "") +
            ". Raise the limit, try another algorithm, or lower small_node_limit.")
    return best


def _dump(plan: Plan, settings: _Settings) -> None:
    if not settings.dump_to:
        return
    out = pathlib.Path(settings.dump_to)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.txt").write_text(str(plan) + "\n" + "\n".join(plan.recomputed) + "\n")
    if settings.dump_dot:
        (out / "before.dot").write_text(plan.to_dot(after=False))
        (out / "after.dot").write_text(plan.to_dot(after=True))
    if settings.dump_memlog:
        (out / "memlog.txt").write_text(plan.memlog())


# ----------------------------------------------------------------------- public

def plan(fun: Callable, *args: Any, memory_limit: Any = _UNSET,
         algorithm: str = _UNSET, scheduler: str = _UNSET,
         small_node_limit: Any = _UNSET, dump_to: str | None = _UNSET,
         **kwargs: Any) -> Plan:
    """Plans ``fun(*args, **kwargs)`` under ``memory_limit`` and compiles the
    result, without running it. See :func:`jit` for the arguments.

    >>> import jax, jax.numpy as jnp, remat
    >>> def loss(ws, x):
    ...   for w in ws:
    ...     x = jnp.tanh(x @ w)
    ...   return jnp.sum(x ** 2)
    >>> ws = [jnp.eye(256) * 0.9] * 12
    >>> p = remat.plan(jax.grad(loss), ws, jnp.ones((1024, 256)), memory_limit=0.7)
    >>> p.met, p.planned.total <= p.limit_bytes < p.baseline.total
    (True, True)
    """
    settings = _settings(memory_limit, algorithm, scheduler, small_node_limit, dump_to)
    return plan_program(fun, args, kwargs, settings, {})


class RematJitted:
    """``remat.jit(fun, ...)``: call it like ``jax.jit(fun)``."""

    def __init__(self, fun: Callable, settings: _Settings, jit_kwargs: dict):
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._settings = settings
        self._jit_kwargs = jit_kwargs
        self._plans: dict[Any, Plan] = {}

    def plan_for(self, *args, **kwargs) -> Plan:
        """The plan used for these argument shapes (planned on first use)."""
        return self._entry(args, kwargs)

    def _entry(self, args, kwargs):
        flat, tree = jax.tree_util.tree_flatten((args, kwargs))
        key = (tree, tuple(core.shaped_abstractify(x) for x in flat))
        if key not in self._plans:
            self._plans[key] = plan_program(self._fun, args, kwargs, self._settings,
                                            self._jit_kwargs)
        return self._plans[key]

    def lower(self, *args, **kwargs):
        """Lowers the rewritten program (``.compile()`` works on the result)."""
        plan = self._entry(args, kwargs)
        return jax.jit(_as_function(plan.jaxpr, plan.out_tree),
                       **self._jit_kwargs).lower(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self._entry(args, kwargs).compiled(*args, **kwargs)


def jit(fun: Callable, *, memory_limit: Any = _UNSET, algorithm: str = _UNSET,
        scheduler: str = _UNSET, small_node_limit: Any = _UNSET,
        dump_to: str | None = _UNSET, **jit_kwargs: Any) -> RematJitted:
    """``jax.jit(fun)``, with the program rewritten to fit in ``memory_limit``.

    Arguments:
      fun: any function: a loss, its gradient, a whole training step.
      memory_limit: the footprint XLA may use (arguments + outputs + temporaries -
        aliased bytes, as ``compile().memory_analysis()`` reports): an int (bytes),
        a string (``"512MiB"``, ``"2GiB"``), or a float in (0, 1]: the program's own
        arguments and outputs plus that fraction of its temporaries without remat
        (library scratch, such as XLA:GPU's cuBLAS workspace, is kept whole: it
        does not shrink with recomputation).
      algorithm: ``"path"`` (default), ``"standard"``, ``"compress"``,
        ``"standardcompress"`` or ``"optimal"`` (the least recompute by integer
        programming, for programs of a few hundred ops; its time limit is
        ``REMAT_FLAGS=--solver_seconds=``, default 60).
      scheduler: ``"best"`` (default), ``"list"``, ``"dfs"`` or ``"postorder"``.
      small_node_limit: values smaller than this (bytes or a size string) are
        never recomputed. When not given (here or in ``REMAT_FLAGS``), 1 MiB,
        halved as far as needed when the values it keeps alone would exceed the
        limit (``Plan.small_node_bytes`` says what was used).
      dump_to: a directory for the plan, and with ``REMAT_FLAGS`` ``--dump_dot`` /
        ``--dump_memlog``, the DOT graphs before and after and the memory log.
      **jit_kwargs: passed to ``jax.jit`` (static arguments are not supported).

    Unset settings come from the ``REMAT_FLAGS`` environment variable. Raises
    :class:`MemoryLimitError` (with the least footprint reached and a lower bound)
    when the limit cannot be met.

    >>> import jax, jax.numpy as jnp, remat
    >>> def loss(ws, x):
    ...   for w in ws:
    ...     x = jnp.tanh(x @ w)
    ...   return jnp.sum(x ** 2)
    >>> step = remat.jit(jax.grad(loss), memory_limit=0.7)
    >>> grads = step([jnp.eye(256) * 0.9] * 12, jnp.ones((1024, 256)))
    >>> len(grads)
    12
    """
    for bad in ("static_argnums", "static_argnames"):
        if bad in jit_kwargs:
            raise NotImplementedError(
                f"remat.jit does not support {bad}; close over static values instead "
                "(e.g. functools.partial(fun, flag=True)).")
    settings = _settings(memory_limit, algorithm, scheduler, small_node_limit, dump_to)
    return RematJitted(fun, settings, jit_kwargs)

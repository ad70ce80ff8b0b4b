"""The automatic pass on programs with differentiated loops.

Loops and the flat program around them are planned against one limit. Each
loop's choices (:func:`remat.core.loops.loop_choices`, what it stacks per
iteration) are merged into one sequence over all loops
(:func:`remat.core.loops.combine`), from no recompute up; each is applied to the
program (:func:`remat._jax.loop_nest.rewrite_nests`) and read in XLA's figures.
The cheapest choice whose program XLA reads within the limit is taken; when none
is, the one that stacks the least. A loop whose body holds loops is planned with
them (``loop_nest.py``): each of its choices is a choice of the inner loops and
its own on the body they rewrote. The flat search (``planner.py``) then plans
the rewritten program against the same limit in bytes, so it recomputes outside the loops only
what the loop choice leaves over the limit. The two are not traded against each
other: a loop choice that stacks more, paired with recompute outside the loops,
is not tried (each such pair would take a flat search of its own, with its own
compiles). A program without such loops goes to the flat search unchanged.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from remat._jax.compat import core
from remat._jax.compat_graph import source_line
from remat._jax.dumps import dump_plan
from remat._jax.plan_record import MemoryLimitError, Plan
from remat._jax.program import Program
from remat._jax.xla_figures import XlaFootprint
from remat._jax.loop_split import segment_sizes, split_loops
from remat._jax.loop_nest import LoopNest, own_choice, plan_nests, rewrite_nests
from remat._jax.loops import find_loops
from remat.core.loops import NestedChoice, combine
from remat.core.memlog import format_bytes
from remat.core.options import RematOptions

__all__ = ["LoopDecision", "LoopPlan", "plan_with_loops"]


@dataclasses.dataclass(frozen=True)
class LoopDecision:
    """What the plan does to one differentiated loop.

    Attributes:
      source: the user source line of the forward loop.
      length: its trip count.
      stacked: the values stacked per iteration (shape and producing op).
      rebuilt: the values the backward loop rebuilds per iteration instead.
      recomputed: the ops it runs again per iteration.
      extra_flops: FLOPs run again, over all iterations.
      stacked_bytes: bytes stacked, over all iterations (unsplit).
      split: the segment size if the loop runs in segments (its forward
        iterations then run twice; ``extra_flops`` counts it), else None.
      within: the source line of the loop this one runs inside, if any.
      runs: how many times the loop runs (the product of the trip counts of the
        loops around it); ``extra_flops`` counts every run, ``stacked_bytes``
        one.
      holds_loops: whether loops run inside this one (their decisions follow
        it); "as written" then means only that it rebuilds nothing itself.
    """
    source: str
    length: int
    stacked: tuple[str, ...]
    rebuilt: tuple[str, ...]
    recomputed: tuple[str, ...]
    extra_flops: float
    stacked_bytes: int
    split: int | None = None
    within: str | None = None
    runs: int = 1
    holds_loops: bool = False

    def __str__(self) -> str:
        kept = ", ".join(self.stacked) or "nothing"
        where = f", inside the loop at {self.within}" if self.within else ""
        text = (f"loop at {self.source} ({self.length} iterations{where}): stacks "
                f"{kept} ({format_bytes(self.stacked_bytes)})")
        if self.rebuilt:
            text += (f"; rebuilds {', '.join(self.rebuilt)} by running "
                     f"{len(self.recomputed)} op(s) again per iteration")
        if self.split:
            text += (f"; split into {self.length // self.split} segments of "
                     f"{self.split}, keeping the carry at each segment's start and "
                     "running each segment's forward iterations again")
        if not self.rebuilt and not self.split:
            return text + (", rebuilding nothing itself" if self.holds_loops
                           else ", as written")
        return text + f" (+{self.extra_flops / 1e9:.2f} GFLOP)"


def _describe(nest: LoopNest, choice, split: int | None, runs: int = 1,
              within: str | None = None) -> list[LoopDecision]:
    """One decision for ``nest`` under ``choice``, then those of the loops inside."""
    bmap = nest.variant(choice).bmap
    own = own_choice(choice)
    graph = bmap.body.graph

    def name(v):
        value = graph.values[v]
        made = "carry" if v in bmap.body.carries else (
            "input" if value.producer is None else graph.ops[value.producer].label)
        return f"{value.shape} ({made})"

    stacked = [*own.kept, *own.carries]
    length = bmap.body.length
    source = source_line(nest.fwd) or "unknown source"
    decisions = [LoopDecision(
        source, length, tuple(name(v) for v in stacked), tuple(name(v) for v in own.rebuilt),
        tuple(f"{graph.ops[o].label} from {graph.ops[o].source or 'unknown source'}"
              for o in own.recompute),
        (own.flops + (sum(op.flops for op in graph.ops) if split else 0)) * length * runs,
        own.stacked_bytes * length, split, within, runs, bool(nest.inner))]
    if isinstance(choice, NestedChoice):
        for inner, c in zip(nest.inner, choice.inner):
            decisions += _describe(inner, c, None, runs * length, source)
    return decisions


@dataclasses.dataclass(frozen=True, repr=False)
class LoopPlan(Plan):
    """A :class:`remat.jit` plan of a program with differentiated loops: the flat
    plan of the program as the loop choice rewrote it (``graph``, ``result`` and
    ``jaxpr`` are that program's), and ``loops``, one decision per loop.
    ``baseline`` is the program as written."""
    loops: tuple[LoopDecision, ...] = ()

    @property
    def extra_flops(self) -> float:
        return self.result.extra_flops + sum(d.extra_flops for d in self.loops)

    @property
    def recomputed(self) -> list[str]:
        return [*(f"{line} (in the backward loop of {d.source})"
                  for d in self.loops for line in d.recomputed), *super().recomputed]

    def _planned_by(self) -> str:
        # (``algorithm`` planned the program the loop choice left: often "plain")
        return f"the loop choice below, then {self.algorithm} on the rest"

    def __str__(self) -> str:
        return "\n".join([super().__str__(), *(f"  {d}" for d in self.loops)])

    def memlog(self) -> str:
        """The memory log of the rewritten program (each loop one op in it), after
        one ``#`` line per loop saying what it stacks and rebuilds."""
        return "\n".join([*(f"# {d}" for d in self.loops), super().memlog()])

    def to_dot(self, after: bool = True) -> str:
        """:meth:`Plan.to_dot`, with the loop decisions as the graph's label."""
        dot = super().to_dot(after)
        text = "".join(f"{d}\\l" for d in self.loops)
        label = '  label="' + text.replace('"', '\\"') + '"; labelloc=t;'
        head, _, rest = dot.partition("\n")
        return "\n".join([head, label, rest])


def plan_with_loops(program: Program, options: RematOptions,
                    plan_flat: Callable[[Program, RematOptions], Plan]) -> Plan:
    """``plan_flat(program, options)`` (the flat search), after choosing what
    each differentiated loop of ``program`` stacks."""
    flat = program.flat
    start = time.perf_counter()
    nests = plan_nests(flat.jaxpr)
    if not nests:
        return plan_flat(program, options)
    pairs = [n.pair for n in nests]
    frontiers = [n.frontier for n in nests]
    chain = combine(frontiers, [n.length for n in nests])
    planning = time.perf_counter() - start

    compiling, compiles = 0.0, 0      # the loop choices' compiles, for the plan

    def rewritten(k: int) -> core.ClosedJaxpr:
        nonlocal planning
        t = time.perf_counter()
        choices = [front[i] for front, i in zip(frontiers, chain[k])]
        closed = core.ClosedJaxpr(rewrite_nests(flat.jaxpr, nests, choices), flat.consts)
        planning += time.perf_counter() - t
        return closed

    def footprint_of(closed: core.ClosedJaxpr) -> int:
        nonlocal compiling, compiles
        t = time.perf_counter()
        total = XlaFootprint.of(program.compile(closed, measure_only=True)).total
        compiling, compiles = compiling + time.perf_counter() - t, compiles + 1
        return total

    footprints: dict[int, int] = {}

    def footprint(k: int) -> int:
        if k not in footprints:
            footprints[k] = footprint_of(rewritten(k))
        return footprints[k]

    # the program as written (the user's checkpoints in it, if any) sets the limit
    written = program.as_written or flat
    t = time.perf_counter()
    baseline = XlaFootprint.of(program.compile(written, measure_only=True))
    compiling += time.perf_counter() - t
    limit = baseline.limit_bytes(options.memory_limit)
    if written is flat:
        footprints[0] = baseline.total
    # The model's footprint of each choice: the plain one, less the bytes no
    # longer stacked, plus the rebuilt values the backward loops hold.
    memory = [sum(front[i].memory(n.length) for front, i, n in zip(frontiers, c, nests))
              for c in chain]
    chosen = _cheapest_within(footprint, [footprint(0) - memory[0] + m for m in memory],
                              limit)
    best, size, reached = rewritten(chosen), None, footprint(chosen)
    if reached > limit:
        reached, best, chosen, size = _split(rewritten, reached, chosen, pairs, limit,
                                             footprint_of)
    at_bytes = dataclasses.replace(options, memory_limit=limit)
    refused = None
    for _ in range(1 + _NEXT_CHOICES):
        t = time.perf_counter()
        decisions = tuple(d for k, (nest, front, i) in enumerate(
            zip(nests, frontiers, chain[chosen]))
            for d in _describe(nest, front[i], size and size[k]))
        planning += time.perf_counter() - t
        try:
            flat_plan = plan_flat(program.rewritten(best, ("loops", chosen, size)), at_bytes)
            break
        except MemoryLimitError as e:
            refused = refused or MemoryLimitError(
                f"remat: with its {len(pairs)} differentiated loop(s) planned for the "
                f"least footprint found ({'; '.join(map(str, decisions))}), the "
                f"program's is {format_bytes(reached)} (as written: "
                f"{format_bytes(baseline.total)}). Planning the rest: {e}",
                e.limit_bytes, e.least_bytes, e.bound_bytes)
            # The choice's measuring compile read it within the limit, its full one
            # over (by kilobytes): the next choice stacks less.
            if size is not None or reached > limit or chosen + 1 == len(chain):
                raise refused from e
            chosen += 1
            best, reached = rewritten(chosen), footprint(chosen)
            if reached > limit:
                raise refused from e
    else:
        raise refused
    fields = {f.name: getattr(flat_plan, f.name) for f in dataclasses.fields(Plan)}
    fields.update(baseline=baseline, loops=decisions,
                  plan_seconds=flat_plan.plan_seconds + planning,
                  compile_seconds=flat_plan.compile_seconds + compiling,
                  compiles=flat_plan.compiles + compiles)
    plan = LoopPlan(**fields)
    dump_plan(plan, options)
    return plan


#: Segment sizes tried per loop when no choice alone meets the limit.
_SPLIT_SIZES = 2


def _split(program, unsplit: int, last: int, pairs, limit: int, footprint_of):
    """``(footprint, program, choice, sizes)``: the loops run in segments (sizes nearest the
    square root of their lengths first), on the program as written, then on the
    choice ``last`` (the least stacked): the first XLA reads within ``limit``,
    else the lowest it reads, the unsplit ``program(last)`` (footprint
    ``unsplit``) included."""
    best = (unsplit, program(last), last, None)
    for k in dict.fromkeys((0, last)):
        closed = program(k)
        # The rewrite keeps equation positions: the pairs are found where they were.
        found = {(p.forward, p.backward): p for p in find_loops(closed.jaxpr)}
        now = [found.get((p.forward, p.backward)) for p in pairs]
        if None in now:
            continue
        for rank in range(_SPLIT_SIZES):
            sizes = [segment_sizes(p_len) for p_len in
                     (closed.jaxpr.eqns[p.forward].params["length"] for p in now)]
            pick = [s[min(rank, len(s) - 1)] if s else None for s in sizes]
            if all(x is None for x in pick):
                break
            split = split_loops(closed, {p: x for p, x in zip(now, pick) if x})
            total = footprint_of(split)
            if total < best[0]:
                best = (total, split, k, tuple(pick))
            if total <= limit:
                return best
    return best


#: Further loop choices tried, each stacking less, when the rest of the program
#: cannot be planned under the limit after the choice taken (its full compile
#: reading over what its measuring compile read within).
_NEXT_CHOICES = 2


def _cheapest_within(footprint: Callable[[int], int], predicted: list[int],
                     limit: int) -> int:
    """The first choice whose footprint is within ``limit`` (memory falls along
    the choices; choice 0 is the program as written), or the last if none is.

    XLA's figure is read first at the first choice the model (``predicted``)
    puts within the limit, then at the one it puts there once its savings are
    scaled to XLA's at that first read (XLA frees more or less than the model
    says, by a steady factor); from there, in steps doubling away, until XLA's
    figure crosses the limit, and then by bisection.
    """
    last = len(predicted) - 1
    base = footprint(0)
    if base <= limit:
        return 0
    read = {0: base}

    def pick(scale: float) -> int:
        return next((i for i, m in enumerate(predicted)
                     if base - scale * (predicted[0] - m) <= limit), last)

    k = pick(1.0)
    read[k] = footprint(k)
    if predicted[0] > predicted[k] and base > read[k]:
        k = pick((base - read[k]) / (predicted[0] - predicted[k]))
        read[k] = footprint(k)
    met = [i for i, f in read.items() if f <= limit]
    if met:
        hi = min(met)
        lo = max(i for i, f in read.items() if f > limit and i < hi)
    else:
        lo, step = max(read), 1
        while lo < last and footprint(min(lo + step, last)) > limit:
            lo, step = min(lo + step, last), 2 * step
        if lo == last:
            return last
        hi = min(lo + step, last)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if footprint(mid) <= limit else (mid, hi)
    return hi

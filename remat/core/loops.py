"""Planning inside a differentiated loop: what the forward loop stacks.

A differentiated loop is two loops: the forward one stacks, per iteration, the
values the backward one reads (its *residuals*: a buffer of ``length`` slices
each), and the backward one runs in reverse over those stacks. Any residual the
forward body computes can instead be rebuilt inside the backward body, per
iteration, from what is still at hand there: the loop's per-iteration inputs (its
constants and the slices of the arrays it scans over), the residuals still
stacked, and the carry each iteration started from, which must then be stacked
too unless it already is. A loop separates the two passes, so the compiler can
neither hoist the rebuilt values out of the backward loop nor merge them with the
forward ones.

The memory of a choice is ``length`` times the bytes stacked per iteration, plus
the rebuilt values the backward body holds (its extra working set); its cost is
``length`` times the FLOPs of the ops run again. :func:`loop_choices` gives the
Pareto frontier of the choices, from "stack everything" (no recompute) to "stack
only the carries" (the most recompute), and :func:`combine` orders choices across
several loops.

Loops compose: a loop whose body holds differentiated loops of its own is planned
on its body *as each choice of the inner loops rewrote it*. There the inner
loop is one op whose outputs are its stacks (``inner length`` times what it
stacks per iteration), so what the outer loop stacks per iteration already counts
them; the inner loops' backward working sets add to the outer one's
(:class:`NestedChoice`), and their recompute runs once per outer iteration.

Example (a body ``y = tanh(x @ w)``, carry ``x``, residuals ``y`` and ``x``)::

    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_input(4096); w = b.add_input(4096)
    >>> (xw,) = b.add_op("dot_general", [x, w], [4096], flops=65536)
    >>> (y,) = b.add_op("tanh", [xw], [4096], flops=1024)
    >>> body = LoopBody(b.build([y, x, y]), length=8, residuals=(y, x), carries=(x,))
    >>> [(c.rebuilt, c.stacked_bytes, c.flops) for c in loop_choices(body)]
    [((), 8192, 0.0), ((3,), 4096, 66560.0)]
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence

from remat.core.graph import Graph

__all__ = ["LoopBody", "LoopChoice", "NestedChoice", "rebuild", "loop_choices", "combine",
           "spread"]

#: Up to this many residuals that may be rebuilt, every subset is tried.
EXHAUSTIVE_RESIDUALS = 12


@dataclasses.dataclass(frozen=True)
class LoopBody:
    """The forward body of a differentiated loop, as the planner sees it.

    Attributes:
      graph: the body; its inputs are the loop's constants, carries and slices.
      length: the trip count.
      residuals: ids of the values the body stacks for the backward loop (no
        repeats).
      carries: ids of the inputs that are the carry at the start of an iteration.
        Every other input is at hand in the backward body at no cost.
      pinned: ids of ops that must not run twice (effects).
    """
    graph: Graph
    length: int
    residuals: tuple[int, ...]
    carries: tuple[int, ...]
    pinned: frozenset[int] = frozenset()

    def __post_init__(self):
        if len(set(self.residuals)) != len(self.residuals):
            raise ValueError(f"LoopBody: residuals repeat: {self.residuals}")
        if self.length < 1:
            raise ValueError(f"LoopBody: length must be >= 1, got {self.length}")

    @property
    def rebuildable(self) -> tuple[int, ...]:
        """The residuals that may be rebuilt: all but the carries (a stacked carry
        rebuilt would be stacked again, as its own source)."""
        return tuple(r for r in self.residuals if r not in self.carries)


@dataclasses.dataclass(frozen=True)
class LoopChoice:
    """What one loop stacks, and what its backward body runs again.

    Attributes:
      kept: residuals still stacked.
      rebuilt: residuals rebuilt in the backward body.
      carries: values newly stacked for the rebuild (carries, or values the
        body makes that are not residuals, such as a matmul's output).
      recompute: ops the backward body runs again, in the body's order.
      stacked_bytes: bytes stacked per iteration.
      working_bytes: what the backward body holds besides: the rebuilt residuals,
        and the largest value made on the way to them (an estimate: the others
        are freed as they are read).
      flops: FLOPs run again per iteration.
    """
    kept: tuple[int, ...]
    rebuilt: tuple[int, ...]
    carries: tuple[int, ...]
    recompute: tuple[int, ...]
    stacked_bytes: int
    working_bytes: int
    flops: float

    def memory(self, length: int) -> int:
        """Bytes of the choice: the stacks and the backward body's extra values."""
        return length * self.stacked_bytes + self.working_bytes


@dataclasses.dataclass(frozen=True)
class NestedChoice:
    """A choice for a loop whose body holds loops: the inner loops' choices, and
    the outer loop's choice on its body as those rewrote it.

    Attributes:
      outer: the choice for the outer loop, on the rewritten body.
      inner: one choice per inner loop (a :class:`LoopChoice` or, deeper, a
        :class:`NestedChoice`).
      inner_lengths: their trip counts.
      variant: which combination of inner choices ``outer`` was planned on (an
        index the adapter keeps; no meaning here).

    Per outer iteration it stacks ``outer.stacked_bytes`` (the inner loops' stacks
    the outer loop keeps are values of its body, so they are in there, each at
    its inner length); its backward body holds ``outer.working_bytes`` plus the
    largest inner working set (the inner backward loops run one after another);
    it runs ``outer.flops`` again plus each inner loop's FLOPs times its length.

    >>> a = LoopChoice((), (), (), (), 100, 10, 2.0)
    >>> n = NestedChoice(LoopChoice((), (), (), (), 40, 5, 1.0), (a,), (3,), 0)
    >>> n.stacked_bytes, n.working_bytes, n.flops, n.memory(4)
    (40, 15, 7.0, 175)
    """
    outer: LoopChoice
    inner: tuple
    inner_lengths: tuple[int, ...]
    variant: int

    @property
    def stacked_bytes(self) -> int:
        return self.outer.stacked_bytes

    @property
    def working_bytes(self) -> int:
        return self.outer.working_bytes + max((c.working_bytes for c in self.inner),
                                              default=0)

    @property
    def flops(self) -> float:
        return self.outer.flops + sum(n * c.flops
                                      for c, n in zip(self.inner, self.inner_lengths))

    @property
    def rebuilt(self) -> tuple[int, ...]:
        """The outer loop's rebuilt residuals."""
        return self.outer.rebuilt

    def memory(self, length: int) -> int:
        """Bytes of the choice: the stacks and the backward bodies' extra values."""
        return length * self.stacked_bytes + self.working_bytes


def spread(count: int, most: int) -> list[int]:
    """At most ``most`` indices into a sequence of ``count``, evenly spread, the
    first and the last included.

    >>> spread(10, 4), spread(3, 5)
    ([0, 3, 6, 9], [0, 1, 2])
    """
    if most < 2:
        raise ValueError(f"spread: most must be at least 2, got {most}")
    if count <= most:
        return list(range(count))
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})


def rebuild(body: LoopBody, rebuilt: Iterable[int],
            stackable: Iterable[int] = ()) -> LoopChoice | None:
    """The choice that rebuilds the residuals ``rebuilt`` from the others; None if
    that needs a pinned op. Each value is rebuilt from the nearest values at hand:
    a kept residual, an input, or a carry or a value of ``stackable`` (stacked
    for it, if the rebuild reads it)."""
    graph = body.graph
    asked = set(rebuilt)
    if not asked <= set(body.residuals):
        raise ValueError(f"rebuild: values {sorted(asked - set(body.residuals))} are "
                         f"not residuals of the loop; its residuals are {body.residuals}")
    rebuilt = tuple(r for r in body.residuals if r in asked)
    if any(r in body.carries for r in rebuilt):
        raise ValueError(f"rebuild: carries cannot be rebuilt: {rebuilt}")
    kept = tuple(r for r in body.residuals if r not in rebuilt)
    at_hand = set(kept) | set(graph.inputs)
    carries = set(body.carries) | set(stackable)
    ops: set[int] = set()
    needed_carries: set[int] = set()
    stack = list(rebuilt)
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in carries and v not in kept:
            needed_carries.add(v)
            continue
        if v in at_hand:
            continue
        op = graph.values[v].producer
        if op in body.pinned:
            return None
        ops.add(op)
        stack.extend(graph.ops[op].inputs)
    order = tuple(o for o in graph.topological_order if o in ops)
    new_carries = tuple(sorted(needed_carries))
    between = [graph.values[v].nbytes for o in order for v in graph.ops[o].outputs
               if v not in asked]
    return LoopChoice(
        kept, rebuilt, new_carries, order,
        graph.total_bytes(kept) + graph.total_bytes(new_carries),
        graph.total_bytes(rebuilt) + max(between, default=0),
        float(sum(graph.ops[o].flops for o in order)))


def _greedy(body: LoopBody) -> Iterable[frozenset[int]]:
    """Drop sets growing one residual at a time, each step the one that frees the
    most bytes per FLOP run again."""
    dropped: frozenset[int] = frozenset()
    current = rebuild(body, dropped)
    while current is not None:
        yield dropped
        best = None
        for r in body.rebuildable:
            if r in dropped:
                continue
            trial = rebuild(body, dropped | {r})
            if trial is None:
                continue
            saved = current.memory(body.length) - trial.memory(body.length)
            ratio = saved / (trial.flops - current.flops + 1.0)
            if best is None or ratio > best[0]:
                best = (ratio, r, trial)
        if best is None:
            return
        dropped, current = dropped | {best[1]}, best[2]


def _greedy_up(body: LoopBody) -> Iterable[frozenset[int]]:
    """Drop sets shrinking one residual at a time from "rebuild everything", each
    step keeping the one that saves the most FLOPs per byte stacked (a step that
    stacks no more bytes first), while a step saves any."""
    dropped = frozenset(r for r in body.rebuildable
                        if rebuild(body, {r}) is not None)
    current = rebuild(body, dropped)
    while current is not None:
        yield dropped
        best = None
        for r in dropped:
            trial = rebuild(body, dropped - {r})
            saved = current.flops - trial.flops
            if saved <= 0:
                continue
            added = trial.memory(body.length) - current.memory(body.length)
            key = (added > 0, saved / max(added, 1))
            key = (key[0], -key[1])
            if best is None or key < best[0]:
                best = (key, r, trial)
        if best is None:
            return
        dropped, current = dropped - {best[1]}, best[2]


def _by_producer_cost(body: LoopBody) -> Iterable[frozenset[int]]:
    """Drop sets that keep the residuals made by the costliest ops: for each
    producer cost, rebuild every residual made more cheaply (inputs cost 0).
    These are the "keep the matmuls" choices."""
    graph = body.graph

    def cost(r):
        op = graph.values[r].producer
        return -1.0 if op is None else graph.ops[op].flops

    for threshold in sorted({cost(r) for r in body.rebuildable}) + [float("inf")]:
        yield frozenset(r for r in body.rebuildable if cost(r) < threshold)


def _by_intensity(body: LoopBody) -> Iterable[frozenset[int]]:
    """Drop sets that rebuild only through cheap ops, one per threshold on an op's
    arithmetic intensity (FLOPs per byte it reads or writes): in the body's
    order, a residual is kept if rebuilding it from what is at hand (inputs,
    carries, residuals kept so far) runs an op at or above the threshold, else
    rebuilt. These are the "save what the matmuls
    make" choices, wherever a reshape or an activation sits between the matmul
    and the residual."""
    graph = body.graph

    def intensity(o):      # FLOPs per byte read or written
        op = graph.ops[o]
        moved = sum(graph.values[v].nbytes for v in (*op.inputs, *op.outputs))
        return op.flops / max(moved, 1)

    order = sorted(body.rebuildable, key=lambda r: (graph.values[r].producer is not None,
                                                     graph.values[r].producer))
    for threshold in sorted({intensity(o) for o in range(graph.num_ops)}, reverse=True):
        dropped: set[int] = set()
        for r in order:
            trial = rebuild(body, dropped | {r})
            if trial is not None and all(intensity(o) < threshold
                                         for o in trial.recompute):
                dropped.add(r)
        yield frozenset(dropped)


def _stacking_intense(body: LoopBody) -> Iterable[tuple[frozenset[int], frozenset[int]]]:
    """``(dropped, stackable)`` pairs: every residual rebuilt, from the outputs of
    the ops at or above a threshold of arithmetic intensity, stacked where the
    rebuild reads them (a save-the-matmuls policy, whatever the residuals are)."""
    graph = body.graph

    def intensity(o):
        op = graph.ops[o]
        moved = sum(graph.values[v].nbytes for v in (*op.inputs, *op.outputs))
        return op.flops / max(moved, 1)

    dropped = frozenset(body.rebuildable)
    for threshold in sorted({intensity(o) for o in range(graph.num_ops)}):
        yield dropped, frozenset(v for o in range(graph.num_ops)
                                 if intensity(o) >= threshold
                                 for v in graph.ops[o].outputs)


def loop_choices(body: LoopBody) -> tuple[LoopChoice, ...]:
    """The Pareto frontier of the choices for ``body``: least recompute first,
    each one needing strictly less memory than the one before. The first stacks
    every residual (no recompute); where every residual can be rebuilt, the last
    stacks only carries. Every subset is tried when at most
    ``EXHAUSTIVE_RESIDUALS`` residuals may be rebuilt; otherwise the greedy
    sequences down from "stack everything" and up from "rebuild everything", the
    keep-the-costliest sequence and the rebuild-through-cheap-ops sequence; and
    always the choices that stack the outputs of the most intense ops (which
    need not be residuals) and rebuild every residual from them."""
    free = body.rebuildable
    if len(free) <= EXHAUSTIVE_RESIDUALS:
        sets: Iterable[frozenset[int]] = (
            frozenset(c) for n in range(len(free) + 1)
            for c in itertools.combinations(free, n))
    else:
        sets = itertools.chain(_greedy(body), _greedy_up(body), _by_producer_cost(body),
                               _by_intensity(body))
    found = {}
    for dropped in sets:
        if dropped not in found:
            found[dropped] = rebuild(body, dropped)
    for dropped, stackable in _stacking_intense(body):
        found[dropped, stackable] = rebuild(body, dropped, stackable)
    return pareto(body.length, [c for c in found.values() if c is not None])


def pareto(length: int, choices: Sequence[LoopChoice]) -> tuple[LoopChoice, ...]:
    """``choices`` on their frontier: by FLOPs, then memory; each kept choice needs
    less memory than every cheaper one."""
    frontier: list[LoopChoice] = []
    for c in sorted(choices, key=lambda c: (c.flops, c.memory(length), c.rebuilt)):
        if not frontier or c.memory(length) < frontier[-1].memory(length):
            frontier.append(c)
    return tuple(frontier)


def combine(frontiers: Sequence[Sequence[LoopChoice]], lengths: Sequence[int]
            ) -> list[tuple[int, ...]]:
    """Choices for several loops at once: index tuples into ``frontiers`` (one per
    loop), from all zeros (each loop's first choice) up, each step moving one loop
    one choice along its frontier: the move that frees the most bytes per FLOP
    added. FLOPs grow and memory shrinks along the list.

    >>> from remat.core.loops import LoopChoice as C
    >>> a = [C((), (), (), (), 100, 0, 0.0), C((), (), (), (), 10, 0, 50.0)]
    >>> b = [C((), (), (), (), 100, 0, 0.0), C((), (), (), (), 10, 0, 5.0)]
    >>> combine([a, b], [1, 1])
    [(0, 0), (0, 1), (1, 1)]
    """
    if len(frontiers) != len(lengths):
        raise ValueError(f"combine: {len(frontiers)} frontiers but {len(lengths)} "
                         "lengths; give one length per loop.")
    at = [0] * len(frontiers)
    chain = [tuple(at)]
    while True:
        best = None
        for i, (front, n) in enumerate(zip(frontiers, lengths)):
            if at[i] + 1 >= len(front):
                continue
            now, nxt = front[at[i]], front[at[i] + 1]
            ratio = (now.memory(n) - nxt.memory(n)) / (n * (nxt.flops - now.flops) + 1.0)
            if best is None or ratio > best[0]:
                best = (ratio, i)
        if best is None:
            return chain
        at[best[1]] += 1
        chain.append(tuple(at))

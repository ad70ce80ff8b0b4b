"""``"segments"``: checkpoint whole segments, as a hand-written segmentation does.

A user who wraps each block of a model in ``checkpoint`` keeps the block's input
for the backward pass and recomputes the whole block from it there. This
algorithm makes those plans on any schedule, without knowing the blocks:

* The *residuals* are the values defined before the schedule's peak step (the
  turn from the forward pass to the backward one, in a training step) and read
  there or after, that may be dropped (a recomputable producer, not fused, not
  under a ``small_node_bytes`` the user gave).
* A *cut* is a value a segment starts from, of two kinds. A residual that every
  later residual depends on, but for those computed from the program's inputs
  alone (a weight's cast). And a block's input, as a user's ``checkpoint`` keeps
  it: a value the forward pass runs through alone (after its op, no other value
  derived from the data is read later in the forward pass), residual or not;
  where a residual connection bypasses a block, only its ends are.
* Keeping every ``k``-th cut (``k = 1, 2, ...``) of one kind, or of both, or
  none, every other residual is dropped and rebuilt, for its readers from the
  peak on, from the kept cuts and the inputs: one region per segment between two
  kept cuts.

A plan can also be realized as a checkpoint's is, each region holding its
segment's backward pass (:func:`with_followers`): its consumers and their
followers (the backward ops reading what they compute and nothing computed
after the region starts: a cotangent passed on, a weight's gradient summed),
which the compiler then fuses with the consumers rather than taking the
region's results from memory. The compiler reads one realization or the other
lower, by program; the automatic pass compiles both.

Segment plans recompute each op of the forward pass about once whatever ``k``;
they differ in what they hold. The plan for a limit is the one with the least
recompute among those whose simulated peak is within it, else the one of least
peak. The other algorithms drop what the model sees at its peak; these
plans drop everything but the cuts, which is what a compiler that holds more
than the model (a value in two layouts, a broadcast materialized) needs.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> from remat.core.options import RematOptions
    >>> from remat.core.scheduled import on_schedule
    >>> b = GraphBuilder()
    >>> x = b.add_input(10)
    >>> (h1,) = b.add_op("f", [x], [100], flops=10)
    >>> (c1,) = b.add_op("f", [h1], [10], flops=10)
    >>> (h2,) = b.add_op("f", [c1], [100], flops=10)
    >>> (y,) = b.add_op("f", [h2], [10], flops=10)
    >>> (g2,) = b.add_op("g", [y, h2], [10])
    >>> (g1,) = b.add_op("g", [g2, h1], [10])
    >>> g = b.build(outputs=[g1])
    >>> r = plan_segments(on_schedule(g, tuple(range(6))), RematOptions(150, "segments"))
    >>> r.met, [tuple(x.recompute) for x in r.regions]
    (True, [(0,)])
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ..evaluate import evaluate
from ..options import RematOptions
from ..plan import PlanError, Region
from ..scheduled import Scheduled
from .recomputable import recomputable
from .result import PlanResult

__all__ = ["plan_segments", "with_followers"]


def plan_segments(scheduled: Scheduled, options: RematOptions) -> PlanResult:
    """Plans with the ``"segments"`` algorithm (see the module docstring)."""
    limit = options.model_target_bytes
    # A segment rebuilds every residual in it, small ones too, unless the user
    # set the small-node limit (the default one serves the greedy algorithms).
    small = options.small_node_bytes if options.small_node_given else 0
    known = scheduled.caches.segmentations
    if small not in known:
        known[small] = _simulated(scheduled, _segmentations(scheduled, small))
    plans = [PlanResult(tuple(rw.regions), rw, tl, scheduled.timeline, limit)
             for rw, tl in known[small]]
    if not plans:
        rw, tl = evaluate(scheduled, [])
        return PlanResult((), rw, tl, scheduled.timeline, limit)
    met = [p for p in plans if p.met]
    if met:
        return min(met, key=lambda p: (p.extra_flops, p.timeline.peak_bytes))
    return min(plans, key=lambda p: (p.timeline.peak_bytes, p.extra_flops))


def _simulated(scheduled: Scheduled, segmentations: list[list[Region]]) -> list:
    """The rewritten program and simulation of each segmentation realizable."""
    out = []
    for regions in segmentations:
        try:
            out.append(evaluate(scheduled, regions))
        except PlanError:
            continue
    return out


def _segmentations(scheduled: Scheduled, small_node_bytes: int) -> list[list[Region]]:
    """The regions of each segmentation: keeping every ``k``-th cut."""
    graph, timeline = scheduled.graph, scheduled.timeline
    turn = timeline.peak_step
    if turn < 0:
        return []
    step_of = {op: s for s, op in enumerate(timeline.schedule)}
    fixed = set(graph.inputs) | set(graph.outputs)

    def far_readers(v: int) -> list[int]:
        return [u for u in graph.users[v] if step_of[u] >= turn]

    residuals = [
        v for v, value in enumerate(graph.values)
        if value.producer is not None and v not in fixed
        and step_of[value.producer] < turn and far_readers(v)
        and not timeline.fused[v] and value.nbytes >= max(small_node_bytes, 1)
        and recomputable(graph, value.producer)]
    if not residuals:
        return []
    residuals.sort(key=lambda v: step_of[graph.values[v].producer])
    computed = _computed_ancestors(graph, residuals)
    chained = [v for v in residuals if computed[v]]     # not from the inputs alone
    dominating = [v for i, v in enumerate(chained)
                  if all(v in computed[w] for w in chained[i + 1:])]
    blocks = _block_inputs(graph, timeline.schedule[:turn], residuals)
    both = sorted(set(dominating) | set(blocks), key=lambda v: step_of[graph.values[v].producer])
    kept_sets = list(dict.fromkeys(
        frozenset(cuts[k - 1::k]) for cuts in (dominating, blocks, both)
        for k in _spacings(len(cuts))))
    out = [_regions(graph, residuals, kept, far_readers, step_of)
           for kept in (*kept_sets, frozenset())]
    return list({tuple(regions): regions for regions in out if regions}.values())


def with_followers(scheduled: Scheduled, result: PlanResult) -> PlanResult:
    """``result``'s plan with each region holding its followers too (see
    :func:`_with_followers`), simulated; ``result`` itself where no region has
    one. The same recompute: only which ops run inside each block changes."""
    timeline = scheduled.timeline
    if not result.regions or timeline.peak_step < 0:
        return result
    step_of = {op: s for s, op in enumerate(timeline.schedule)}
    regions = _with_followers(scheduled.graph, list(result.regions),
                              timeline.schedule[timeline.peak_step:], step_of)
    if tuple(regions) == tuple(result.regions):
        return result
    try:
        rewritten, simulated = evaluate(scheduled, regions)
    except PlanError:
        return result
    return PlanResult(tuple(rewritten.regions), rewritten, simulated, timeline,
                      result.limit_bytes, small_node_bytes=result.small_node_bytes)


def _with_followers(graph, regions: list[Region], backward: Sequence[int],
                    step_of: dict[int, int]) -> list[Region]:
    """The regions, each with its followers among its consumers: the ops of the
    backward pass (``backward``, in order) that read what its consumers (or
    followers) compute, and otherwise only values of the forward pass or of
    the backward pass before its first consumer (of the region whose first
    consumer is latest, where they read several). A user's checkpoint holds
    its segment's whole backward pass so: a gradient summed over its layers, a
    cotangent passed on, are computed where the compiler can fuse them with
    the consumers, not from results the region hands out in memory."""
    if not regions:
        return regions
    turn = step_of[backward[0]]
    owner = {u: i for i, r in enumerate(regions) for u in r.consumers}
    first = [min(step_of[u] for u in r.consumers) for r in regions]
    followers: list[list[int]] = [[] for _ in regions]
    for u in backward:
        if u in owner:
            continue
        producers = [p for p in (graph.values[v].producer for v in graph.ops[u].inputs)
                     if p is not None and step_of[p] >= turn]
        read = {owner[p] for p in producers if p in owner}
        if not read:
            continue
        last = max(read, key=first.__getitem__)
        if all(owner.get(p) == last or step_of[p] < first[last] for p in producers):
            owner[u] = last
            followers[last].append(u)
    return [Region(r.recompute, tuple(sorted((*r.consumers, *more))))
            for r, more in zip(regions, followers)]


def _block_inputs(graph, forward: Sequence[int], residuals: list[int]) -> list[int]:
    """The values the forward pass (the ops of ``forward``, in order) runs
    through, each alone: after its op, no other value derived from the data is
    read by a later op of the forward pass. The data are the inputs most
    residuals derive from (weights enter one block each). A block of a model
    begins at one: a residual connection's input is one, the values inside
    the block it bypasses are not.

    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x, w = b.add_input(8), b.add_input(8)
    >>> (h,) = b.add_op("norm", [x, w], [8])
    >>> (y,) = b.add_op("add", [x, h], [8])     # x + f(x): y is a block's input
    >>> (z,) = b.add_op("tanh", [y], [8])
    >>> _block_inputs(b.build(outputs=[z]), (0, 1, 2), [h, y])
    [3]
    """
    derives = [0] * len(graph.values)       # the inputs each value derives from, as bits
    for i, v in enumerate(graph.inputs):
        derives[v] = 1 << i
    last_read = {}
    for step, op in enumerate(forward):
        bits = 0
        for u in graph.ops[op].inputs:
            bits |= derives[u]
            last_read[u] = step
        for v in graph.ops[op].outputs:
            derives[v] = bits
    counts = [sum(derives[r] >> i & 1 for r in residuals) for i in range(len(graph.inputs))]
    most = max(counts, default=0)
    data = sum(1 << i for i, n in enumerate(counts) if n == most and most > 0)
    pending = {v for v in graph.inputs if derives[v] & data and v in last_read}
    cuts = []
    for step, op in enumerate(forward):
        outputs = graph.ops[op].outputs
        pending.difference_update(u for u in graph.ops[op].inputs if last_read[u] == step)
        pending.update(v for v in outputs if derives[v] & data and last_read.get(v, -1) > step)
        if len(pending) == 1 and not pending.isdisjoint(outputs):
            cuts.extend(pending)
    return cuts


#: Spacings of the kept cuts tried: every one up to this, then growing by half.
_EVERY_SPACING_UP_TO = 4


def _spacings(cuts: int) -> list[int]:
    """The ``k`` tried (keep every ``k``-th of ``cuts`` cuts): 1 to 4, then each
    half as large again, so that a deep program gets a dozen plans, not one per cut.

    >>> _spacings(3), _spacings(40)
    ([1, 2, 3], [1, 2, 3, 4, 6, 9, 14, 21, 32])
    """
    out, k = [], 1
    while k <= cuts:
        out.append(k)
        k = k + 1 if k < _EVERY_SPACING_UP_TO else (3 * k + 1) // 2
    return out


def _computed_ancestors(graph, residuals: list[int]) -> dict[int, set[int]]:
    """For each residual, the computed values (not inputs) it depends on."""
    memo: dict[int, set[int]] = {}

    def ancestors(v: int) -> set[int]:
        stack, seen = [v], set()
        while stack:
            w = stack.pop()
            producer = graph.values[w].producer
            if producer is None:
                continue
            for u in graph.ops[producer].inputs:
                if u not in seen and graph.values[u].producer is not None:
                    seen.add(u)
                    stack.append(u)
        return seen

    for v in residuals:
        memo[v] = ancestors(v)
    return memo


def _regions(graph, residuals: list[int], kept: frozenset[int], far_readers,
             step_of: dict[int, int]) -> list[Region]:
    """One region per segment: the dropped residuals after a kept cut (up to the
    next one), rebuilt from the kept cuts and the inputs for their late readers."""
    marks = sorted(step_of[graph.values[c].producer] for c in kept)
    segments: dict[int, list[int]] = {}
    for v in residuals:
        if v not in kept:
            at = bisect.bisect_right(marks, step_of[graph.values[v].producer])
            segments.setdefault(at, []).append(v)
    regions = []
    for _, dropped in sorted(segments.items()):
        ops: set[int] = set()
        stack = list(dropped)
        while stack:
            v = stack.pop()
            producer = graph.values[v].producer
            if producer is None or v in kept or producer in ops:
                continue
            if not recomputable(graph, producer):
                continue
            ops.add(producer)
            stack.extend(graph.ops[producer].inputs)
        consumers = sorted({u for v in dropped for u in far_readers(v)} - ops)
        if ops and consumers:
            regions.append(Region(tuple(sorted(ops)), tuple(consumers)))
    return regions

"""Merging regions that recompute the same ops, checked by the simulator.

The greedy engine frees values one at a time, so two regions often rebuild the
same stretch: in a checkpointed chain, the region serving layer ``j``'s backward
recomputes layers ``1..j`` of the segment and the one serving layer ``j - 1``
recomputes ``1..j-1`` again, which doubles the recomputation of a segment.
One region serving both rebuilds the stretch once and holds the copies from the
first rebuild to the last reader: less compute, more memory.

:func:`merge_regions` tries such merges, the pair sharing the most recompute
cost first, and keeps each merge after which the rewritten program, simulated
for real, is still within the limit. It stops when no pair shares cost or when
``max_trials`` merges were tried.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> from remat.core.plan import Region
    >>> b = GraphBuilder()
    >>> x = b.add_input(10)
    >>> (a,) = b.add_op("f", [x], [100], flops=50)
    >>> (c,) = b.add_op("g", [a], [100], flops=50)
    >>> (y,) = b.add_op("h", [c], [10])
    >>> (z,) = b.add_op("h", [y, c], [10])
    >>> (w,) = b.add_op("h", [z, a], [10])
    >>> g = b.build(outputs=[w])
    >>> two = [Region((0, 1), (3,)), Region((0,), (4,))]
    >>> merge_regions(g, tuple(range(5)), two, limit_bytes=1000)
    [Region(recompute=(0, 1), consumers=(3, 4))]
"""

from __future__ import annotations

from collections.abc import Sequence

from ..graph import Graph
from ..plan import PlanError, Region, apply_plan
from ..simulate import simulate
from .cost import op_cost

__all__ = ["merge_regions"]


def _merged(a: Region, b: Region) -> Region:
    return Region(tuple(sorted(set(a.recompute) | set(b.recompute))),
                  tuple(sorted(set(a.consumers) | set(b.consumers))))


def _peak(graph: Graph, schedule: Sequence[int], regions: Sequence[Region]) -> int:
    rewritten = apply_plan(graph, schedule, regions)
    return simulate(rewritten.graph, rewritten.schedule, check=False).peak_bytes


def merge_regions(graph: Graph, schedule: Sequence[int], regions: Sequence[Region],
                  limit_bytes: int, max_trials: int = 200) -> list[Region]:
    """``regions`` with pairs that share recomputed ops merged, as long as the
    simulated peak of the rewritten program stays within ``limit_bytes``."""
    regions = list(regions)
    rejected: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    trials = 0
    while trials < max_trials:
        best = None
        for i in range(len(regions)):
            rec_i = set(regions[i].recompute)
            for j in range(i + 1, len(regions)):
                shared = rec_i.intersection(regions[j].recompute)
                if not shared:
                    continue
                key = (regions[i].recompute + (-1,) + regions[i].consumers,
                       regions[j].recompute + (-1,) + regions[j].consumers)
                if key in rejected:
                    continue
                saving = sum(op_cost(graph, o) for o in shared)
                if saving > 0 and (best is None or saving > best[0]):
                    best = (saving, i, j, key)
        if best is None:
            break
        _, i, j, key = best
        trials += 1
        trial = [r for k, r in enumerate(regions) if k not in (i, j)]
        trial.append(_merged(regions[i], regions[j]))
        try:
            fits = _peak(graph, schedule, trial) <= limit_bytes
        except PlanError:
            fits = False
        if fits:
            regions = trial
        else:
            rejected.add(key)
    return regions

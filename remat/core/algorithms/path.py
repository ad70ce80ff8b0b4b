"""``"path"``: rematerialize whole operand paths, then give back what is not needed.

After the seed's "path" algorithm (microsoft/tensorflow-rematerialization):

1. *Rematerialize paths*: at the peak, drop a live value and recompute it through
   its whole operand path, back to values that are live anyway at its next use
   (the articulation points of the program between the two uses), so one region
   recomputes a whole stretch instead of one op at a time. Repeat while the peak
   is over the limit and shrinks.
2. *De-rematerialize*: walk the regions from the most to the least expensive per
   byte they free and remove each one whose removal keeps the simulated peak
   within the limit, so no recomputation is kept that the limit does not need.
"""

from __future__ import annotations

from typing import Sequence

from ..graph import Graph
from ..options import RematOptions
from .greedy import PlanResult, Strategy, evaluate, op_cost, run_greedy
from .recomputable import recomputable

__all__ = ["plan_path"]


def plan_path(graph: Graph, schedule: Sequence[int],
              options: RematOptions) -> PlanResult:
    """Plans with the ``"path"`` algorithm (see the module docstring)."""
    first = run_greedy(graph, schedule, options,
                       Strategy(allows=recomputable, start_depth=options.max_chain_ops))
    if not first.met:
        return first
    regions = list(first.regions)
    rw, tl = first.rewritten, first.timeline

    def cost_per_byte(r) -> float:
        freed = sum(graph.values[v].nbytes for o in r.recompute
                    for v in graph.ops[o].outputs) or 1
        return sum(op_cost(graph, o) for o in r.recompute) / freed

    for region in sorted(regions, key=cost_per_byte, reverse=True):
        trial = [r for r in regions if r != region]
        rw2, tl2 = evaluate(graph, schedule, trial)
        if tl2.peak_bytes <= options.memory_limit_bytes:
            regions, rw, tl = trial, rw2, tl2
    return PlanResult(tuple(regions), rw, tl, first.baseline, first.limit_bytes)

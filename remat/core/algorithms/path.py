"""``"path"``: rematerialize whole operand paths, then give back what is not needed.

After the seed's "path" algorithm (microsoft/tensorflow-rematerialization):

1. *Rematerialize paths*: at the peak, drop a live value and recompute it through
   its whole operand path, back to values that are live anyway at its next use
   (the articulation points of the program between the two uses), so one region
   recomputes a whole stretch instead of one op at a time.
2. *De-rematerialize*: walk the drops from the most to the least expensive per
   byte and put back each one whose return keeps the estimated peak within the
   limit, so no recomputation is kept that the limit does not need.
"""

from __future__ import annotations

from typing import Sequence

from ..graph import Graph
from ..options import RematOptions
from .greedy import Drop, Estimate, PlanResult, Strategy, run_greedy
from .recomputable import recomputable

__all__ = ["plan_path"]


def _give_back(est: Estimate, target: int) -> list[Drop]:
    kept = list(est.drops)
    # Drops tied to others (one grew the other's chain) stay; the rest are tried,
    # the most expensive per byte first.
    free = [d for k, d in enumerate(est.drops) if not d.extends and k not in est.extended]
    for d in sorted(free, key=lambda d: d.score):
        est.apply(d, sign=-1)
        if est.peak()[0] <= target:
            kept.remove(d)
        else:
            est.apply(d, sign=1)
    return kept


def plan_path(graph: Graph, schedule: Sequence[int],
              options: RematOptions) -> PlanResult:
    """Plans with the ``"path"`` algorithm (see the module docstring)."""
    whole_paths = Strategy(allows=recomputable, start_depth=options.max_chain_ops)
    return run_greedy(graph, schedule, options, [whole_paths], keep=_give_back)

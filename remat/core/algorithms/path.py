"""``"path"``: rematerialize whole operand paths, then give back what is not needed.

After the seed's "path" algorithm (microsoft/tensorflow-rematerialization):

1. *Rematerialize paths*: at the peak, drop a live value and recompute it through
   its whole operand path, back to values that are live anyway at its next use
   (the articulation points of the program between the two uses), so one region
   recomputes a whole stretch instead of one op at a time.
2. *De-rematerialize*: walk the drops from the most to the least expensive per
   byte and put back each one whose return keeps the estimated peak within the
   limit, so no recomputation is kept that the limit does not need.

With a small-node limit the user did not set, it plans under none as well
(:func:`~remat.core.algorithms.result.small_node_variants`).
"""

from __future__ import annotations

from ..options import RematOptions
from .greedy import cheapest_greedy
from ..scheduled import Scheduled
from .recomputable import recomputable
from .result import PlanResult
from .sweep import Strategy

__all__ = ["plan_path"]


def plan_path(scheduled: Scheduled, options: RematOptions) -> PlanResult:
    """Plans with the ``"path"`` algorithm (see the module docstring)."""
    return cheapest_greedy(scheduled, options, [
        Strategy(allows=recomputable, start_depth=options.max_chain_ops)])[0]

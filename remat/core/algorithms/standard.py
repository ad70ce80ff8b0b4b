"""``"standard"``: XLA-style greedy rematerialization, made cost-aware.

At the peak, recompute the live value that frees the most bytes per unit of
recompute cost, just before its next use, from values still live there; start
with single-op recomputations and double the chain length when stuck (XLA's
growing block size). Unlike XLA's pass:

* the cost of the recomputation counts;
* once the peak is within the limit, drops the limit does not need are given
  back (a costly drop taken while the peak was elsewhere is often unneeded);
* a second run starts at chains of 8 ops, and the cheaper plan that meets the
  limit wins: with one-op chains, a cheap value whose operand is gone cannot be
  rebuilt, so the greedy takes the expensive operand instead (a convolution's
  output rather than the ReLU after it), at many times the least recompute;
* regions that rebuild the same ops are merged where the limit allows;
* exchanges: the plan again with its dearest recomputed op banned, kept while it
  meets the limit for less (:func:`~remat.core.algorithms.greedy.plan_exchanged`);
* with a small-node limit the user did not set, it plans under none as well
  (:func:`~remat.core.algorithms.result.small_node_variants`).
"""

from __future__ import annotations

from ..options import RematOptions
from ..scheduled import Scheduled
from .greedy import plan_exchanged
from .recomputable import recomputable
from .result import PlanResult
from .sweep import Strategy

__all__ = ["plan_standard", "STANDARD"]

#: XLA's block sizes: chains of one op at first, doubled when stuck.
STANDARD = Strategy(allows=recomputable)
#: A second start at a larger block size (see the module docstring).
STANDARD_WIDE = Strategy(allows=recomputable, start_depth=8)


def plan_standard(scheduled: Scheduled, options: RematOptions) -> PlanResult:
    """Plans with the ``"standard"`` algorithm (see the module docstring)."""
    return plan_exchanged(scheduled, options, (STANDARD, STANDARD_WIDE))

"""``"standard"``: XLA-style greedy rematerialization, made cost-aware.

At the peak, recompute the live value that frees the most bytes per unit of
recompute cost, just before its next use, from values still live there; start
with single-op recomputations and double the chain length when stuck (XLA's
growing block size). Unlike XLA's pass, the cost of the recomputation counts.
Known weakness: values freed one at a time make many small regions, so a value
needed by several regions is recomputed in each.
"""

from __future__ import annotations

from typing import Sequence

from ..graph import Graph
from ..options import RematOptions
from .greedy import PlanResult, Strategy, run_greedy
from .recomputable import recomputable

__all__ = ["plan_standard", "STANDARD"]

STANDARD = Strategy(allows=recomputable)


def plan_standard(graph: Graph, schedule: Sequence[int],
                  options: RematOptions) -> PlanResult:
    """Plans with the ``"standard"`` algorithm (see the module docstring)."""
    return run_greedy(graph, schedule, options, [STANDARD])

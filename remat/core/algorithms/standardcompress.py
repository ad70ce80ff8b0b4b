"""``"standardcompress"``: compress first (nearly free), then ``"standard"``."""

from __future__ import annotations

from typing import Sequence

from ..graph import Graph
from ..options import RematOptions
from .compress import COMPRESS
from .greedy import give_back, run_greedy
from .result import PlanResult, cheapest_consolidated
from .standard import STANDARD, STANDARD_WIDE

__all__ = ["plan_standardcompress"]


def plan_standardcompress(graph: Graph, schedule: Sequence[int],
                          options: RematOptions) -> PlanResult:
    """Plans with ``"compress"``, then continues with ``"standard"``."""
    return cheapest_consolidated(graph, schedule, [
        run_greedy(graph, schedule, options, [COMPRESS, start], keep=give_back,
                   consolidate=False)
        for start in (STANDARD, STANDARD_WIDE)])

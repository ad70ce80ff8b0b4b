"""``"standardcompress"``: compress first (nearly free), then ``"standard"``."""

from __future__ import annotations

from typing import Sequence

from ..graph import Graph
from ..options import RematOptions
from .compress import plan_compress
from .greedy import PlanResult, Strategy, run_greedy
from .recomputable import recomputable

__all__ = ["plan_standardcompress"]


def plan_standardcompress(graph: Graph, schedule: Sequence[int],
                          options: RematOptions) -> PlanResult:
    """Plans with ``"compress"``, then continues with ``"standard"``."""
    first = plan_compress(graph, schedule, options)
    if first.met:
        return first
    return run_greedy(graph, schedule, options, Strategy(allows=recomputable),
                      regions=first.regions)

"""``"standardcompress"``: compress first (nearly free), then ``"standard"``."""

from __future__ import annotations

from ..options import RematOptions
from ..scheduled import Scheduled
from .compress import COMPRESS
from .greedy import give_back, run_greedy
from .result import PlanResult, cheapest_consolidated
from .standard import STANDARD, STANDARD_WIDE

__all__ = ["plan_standardcompress"]


def plan_standardcompress(scheduled: Scheduled, options: RematOptions) -> PlanResult:
    """Plans with ``"compress"``, then continues with ``"standard"``."""
    return cheapest_consolidated(scheduled, [
        run_greedy(scheduled, options, [COMPRESS, start], keep=give_back,
                   consolidate=False)
        for start in (STANDARD, STANDARD_WIDE)])

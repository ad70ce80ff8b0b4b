"""Where a walk goes next on its column's rungs: arithmetic on plain numbers.

A walk (:meth:`remat.core.search.Frontier.walk`) compiles the plan of one rung
(an index into the column's ascending model targets), reads the compiler's
footprint and picks the next rung from the footprints read so far. Rules:

* After a miss, :func:`rung_below`: down by the miss converted into the model
  (model bytes per compiled byte), and at least :func:`rungs_to_step` rungs.
* :func:`rungs_to_step`: one after a first miss. After two misses, twice the
  last step where the footprint did not fall (the plans between drop nothing
  the compiler holds at its peak: a rung at a time would spend a compile on
  each); else, for a walk no answer bounds, as far as the line through the two
  footprints puts the limit, at most twice the last step; a walk for less
  recompute than an answer steps one rung (any rung may hold a cheaper plan).
* Once a plan met the limit, :func:`rung_between` refines: the highest rung
  below the miss that the line through the two footprints puts within the
  limit (the compiler's footprint is seldom a line in the model's target).

A rung returned is never above the rung it steps from, nor below 0.

>>> ladder = (100, 200, 300, 400)
>>> rungs_to_step(ladder, 3, lo=450, missed=None, hi=None, limit=400, bounded=False)
1
>>> rung_below(ladder, 3, peak=400, footprint=450, limit=400, model_per_xla=1.0, step=1)
2
>>> rung_below(ladder, 3, peak=400, footprint=650, limit=400, model_per_xla=1.0, step=1)
0
>>> rung_between(ladder, met=0, lo=300, missed=3, hi=600, limit=400)
1
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

__all__ = ["rung_below", "rungs_to_step", "rung_between"]


def _rung_at(rungs: Sequence[int], target: float) -> int:
    """The highest rung at or below ``target`` (-1 if none is)."""
    return bisect.bisect_right(rungs, target) - 1


def rung_below(rungs: Sequence[int], k: int, *, peak: int, footprint: int, limit: int,
               model_per_xla: float, step: int) -> int:
    """The rung after a miss at ``k`` (its plan's model ``peak``, read at
    ``footprint``, over ``limit``): the model target less the miss in model
    bytes, at least ``step`` rungs down."""
    target = min(rungs[k], peak) - math.ceil((footprint - limit) * model_per_xla)
    return max(min(k - step, _rung_at(rungs, target)), 0)


def rungs_to_step(rungs: Sequence[int], k: int, *, lo: int, missed: int | None,
                  hi: int | None, limit: int, bounded: bool) -> int:
    """Rungs to step down after a miss at ``k`` read at ``lo``, the walk's last
    miss at rung ``missed`` read at ``hi`` (None: no miss before); ``bounded``:
    an answer bounds the walk (the module's rule)."""
    if missed is None or hi is None:
        return 1
    last = missed - k
    if hi <= lo:
        return 2 * last
    if bounded:
        return 1
    target = rungs[k] - (lo - limit) * (rungs[missed] - rungs[k]) / (hi - lo)
    return min(2 * last, max(1, k - _rung_at(rungs, target)))


def rung_between(rungs: Sequence[int], *, met: int, lo: int, missed: int, hi: int,
                 limit: int) -> int:
    """The rung to refine with, between ``met`` (read at ``lo``, within
    ``limit``) and ``missed`` (read at ``hi``, over it): the highest below
    ``missed`` the line through the two footprints puts within the limit
    (``met`` if none), or the middle where the footprints give no slope."""
    if hi <= lo:
        return (met + missed) // 2
    t_lo, t_hi = rungs[met], rungs[missed]
    target = t_lo + (limit - lo) * (t_hi - t_lo) // (hi - lo)
    return max(met, min(missed - 1, _rung_at(rungs, target)))

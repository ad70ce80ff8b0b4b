"""The search's records: a column (one way of planning), the ladder of model
targets it is asked at, its plans before and after they are compiled.

A column is asked for plans only at its rungs (:func:`rungs`): evenly spaced
model targets from its floor to the plain program's peak, and a few more just
above the floor. A plan (:class:`Candidate`) depends only on its column and
rung; compiled, it becomes a :class:`Point`, the compiler's footprint beside the
FLOPs it recomputes. :mod:`remat.core.search` decides which to compile.

>>> rungs(100, 200, 4, fine=2)
(100, 112, 125, 150, 175)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Hashable
from typing import Any

__all__ = ["RUNGS", "FINE_RUNGS", "Candidate", "Point", "Column", "rungs"]

#: Model targets per column, from its floor to the plain peak. More rungs: plans
#: nearer any limit, and a longer walk of every rung before a limit is refused.
RUNGS = 32
#: Extra rungs in the lowest of the ``RUNGS`` intervals, evenly spaced: near its
#: floor a column has few plans left, and how the compiler packs each one's heap
#: (holes of a few percent) decides a tight limit more than the model does.
FINE_RUNGS = 8


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A plan, before it is compiled.

    Attributes:
      key: the plan's identity: equal keys, the same program (compiled once).
      model_peak: its peak in the planner's model.
      extra_flops: the FLOPs it recomputes.
      payload: whatever the caller needs to compile it.
    """
    key: Hashable
    model_peak: int
    extra_flops: float
    payload: Any = None


@dataclasses.dataclass(frozen=True)
class Point:
    """A compiled plan: its compiled footprint and its recompute.

    Attributes:
      key: the key of its :class:`Candidate`.
      footprint: bytes, as the compiler reports them.
      extra_flops: the FLOPs it recomputes.
      column: the name of the column that planned it first.
      payload: whatever the caller keeps of it (the compiled program).
      rank: its column's rank (lower is preferred at equal extra FLOPs).
    """
    key: Hashable
    footprint: int
    extra_flops: float
    column: str
    payload: Any = None
    rank: int = 0


@dataclasses.dataclass(frozen=True)
class Column:
    """One way of planning a program.

    Attributes:
      name: shown in logs and answers (e.g. ``"path"``).
      rungs: the model targets it plans for, ascending (:func:`rungs`).
      model_per_xla: model bytes per compiled byte (to convert a miss).
      estimate: a compiled limit -> the model target expected to meet it
        (non-decreasing in the limit).
      plan: a model target -> the :class:`Candidate` planned for it.
      rank: 0, or more for a column whose plans are worse in a way their extra
        FLOPs do not show (e.g. a slower lowering): of two points with equal
        extra FLOPs within a limit, the one of the lower rank answers it; and
        once a walk met a limit, only columns of its rank (and those naming it in
        ``walked_after``) are walked after it.
      plans_quickly: whether a plan takes far less time than a compile (once a
        limit is met, only such a column's start is planned, to decide its walk).
      walked_after: ranks besides its own after whose answer this column may be
        walked (e.g. its plans under a lowering that keeps fewer bytes).
      last_resort: walked only in step 2d of :mod:`remat.core.search` (and
        not counted in dividing ``MAX_COMPILES`` into shares); its rungs come
        last in step 3.
      twin_of: the name of the column whose plans it compiles otherwise (the
        same rungs and plans under another lowering), or None.
    """
    name: str
    rungs: tuple[int, ...]
    model_per_xla: float
    estimate: Callable[[int], int]
    plan: Callable[[int], Candidate]
    rank: int = 0
    plans_quickly: bool = True
    walked_after: Container[int] = frozenset()
    last_resort: bool = False
    twin_of: str | None = None


def rungs(floor: int, peak: int, count: int = RUNGS, fine: int = FINE_RUNGS
          ) -> tuple[int, ...]:
    """``count`` model targets evenly spaced from ``floor`` up to, not including,
    ``peak``, and ``fine`` more in the lowest interval (distinct, ascending).

    >>> rungs(100, 200, 4, fine=0)
    (100, 125, 150, 175)
    >>> rungs(100, 200, 4, fine=5)
    (100, 105, 110, 115, 120, 125, 150, 175)
    """
    floor = min(floor, peak)
    span = peak - floor
    coarse = {floor + span * j // count for j in range(count)}
    return tuple(sorted(coarse | {floor + span * j // (count * fine)
                                  for j in range(fine)}))

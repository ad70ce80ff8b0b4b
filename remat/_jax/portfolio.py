"""The columns of the automatic pass on one program, in the order its search walks them.

A column is one algorithm on one order of the program's ops
(:class:`remat.core.columns.Column`); :func:`laid_out` puts them in the order the
search walks them and gives each its rank:

* the first order with each algorithm first (the strongest planner last among
  them), then the other orders: a new order costs compiles of its own plans,
  which on the first order are often those of another algorithm; ``"optimal"``
  on the other orders last (each rung a solve of up to seconds: it only takes
  limits no other column meets);
* ranks: 2 * the order's index, plus one under the other lowering. At equal
  FLOPs the first order's plan answers, under the default lowering; once a walk
  met a limit, only columns of its rank (the other algorithms on its order and
  lowering) are walked for less recompute, and the same column's plans under
  the other lowering (XLA may read them lower, so their walk may meet higher up);
* where the platform has two lowerings (CPU: the gate for regions that read
  convolutions, the conditional for the others), each column of the first order
  is followed by its plans under the other one (:func:`relowered`): the
  lowering's extra bytes (the gate's copies of the inputs; a branch's copies of
  inputs XLA laid out transposed), not the plan, are what usually misses a tight
  limit. The other orders' columns under the other lowering are last resorts:
  walked only after a slow column's answer, their rungs compiled after every
  other rung for a limit nothing else met (XLA's reading of a plan may depend on
  its lowering more than on its order);
* ``"segments"``' plans realized as a checkpoint's regions are (each region
  holding its segment's whole backward pass), under each lowering, are last
  resorts after all: XLA reads some programs' segmentations lower so, others'
  higher.

>>> from remat.core.columns import Candidate, Column
>>> def column(name, order):
...     return Column(f"{name}/order {order}", (1,), 1.0, int,
...                   lambda target: Candidate(target, target, 0.0), rank=2 * order)
>>> columns = laid_out(column, ("path", "standard"), 2, "cond", dict)
>>> [(c.name, c.rank) for c in columns][:3]
[('path/order 0', 0), ('path/order 0 (cond)', 1), ('standard/order 0', 0)]
>>> [c.name for c in columns if c.last_resort]
['path/order 1 (cond)', 'standard/order 1 (cond)']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from remat.core.columns import Candidate, Column
from remat.core.options import PORTFOLIO, RematOptions

__all__ = ["PORTFOLIO_ALGORITHMS", "OPTIMAL_MAX_OPS", "LAST_RESORT", "algorithms",
           "laid_out", "relowered", "WhileGatedReadsLower"]

#: The algorithms of the default, in the order its walks try them.
PORTFOLIO_ALGORITHMS = ("path", "standard", "optimal", "segments")
#: ``"optimal"`` joins the default only for graphs of at most this many ops: each
#: rung is an integer program, whose time grows fast with the program, and the
#: default should answer in about a compile's time. It plans on every order, as
#: ``algorithm="optimal"`` does (the default refuses no limit a chosen algorithm
#: meets), walked after the heuristics of every order.
OPTIMAL_MAX_OPS = 400
#: Algorithms walked for a limit only while no plan is known within it:
#: ``"optimal"`` (a solve may take longer than a compile) and ``"segments"`` (its
#: plans rebuild whole segments, seldom cheaper than an answer found, and it
#: simulates every segmentation before it answers).
LAST_RESORT = frozenset({"optimal", "segments"})


def algorithms(options: RematOptions, num_ops: int) -> tuple[str, ...]:
    """The algorithms planned with: the one chosen, or the default's for a
    program of ``num_ops`` ops."""
    if options.algorithm != PORTFOLIO:
        return (options.algorithm,)
    return tuple(a for a in PORTFOLIO_ALGORITHMS
                 if a != "optimal" or num_ops <= OPTIMAL_MAX_OPS)


def laid_out(column: Callable[[str, int], Column], names: Sequence[str],
             orders: int, fallback: str | None, points: Callable[[], dict],
             whole: Callable[[int], Column] | None = None) -> list[Column]:
    """The columns of ``names`` (algorithms) on ``orders`` orders, ``column(name,
    order)`` each, in the order the search walks them (the module's rules);
    with ``fallback``, the platform's other lowering, the twins under it.
    ``points()``: the frontier's points (read by :class:`WhileGatedReadsLower`).
    With ``whole``, ``"segments"``' plans on order ``k`` realized as checkpoints
    are (``whole(k)``), last resorts after every other column."""
    others = [column(name, k) for k in range(1, orders)
              for name in names if name != "optimal"]
    columns = [*(column(name, 0) for name in names), *others]
    columns += [column("optimal", k) for k in range(1, orders) if "optimal" in names]
    wholes = ([dataclasses.replace(whole(k), last_resort=True) for k in range(orders)]
              if whole is not None and "segments" in names else [])
    if fallback is None:
        return [*columns, *wholes]
    wholes += [dataclasses.replace(relowered(col, fallback, points), last_resort=True)
               for col in wholes]
    first = len(names)
    return [*(c for col in columns[:first] for c in (col, relowered(col, fallback, points))),
            *columns[first:],
            *(dataclasses.replace(relowered(col, fallback, points), last_resort=True)
              for col in others), *wholes]


class WhileGatedReadsLower:
    """The ranks a gated column is walked after: its default column's
    (``rank``), while every plan of the program compiled both gated and in a
    conditional (among ``points()``, the frontier's) was read lower gated. The
    gate reads lower where a branch copies inputs XLA laid out otherwise, higher
    where its own gated copies weigh more; the first gated walk after an answer
    decides."""

    def __init__(self, rank: int, points: Callable[[], dict]):
        self.rank, self.points = rank, points

    def __contains__(self, rank: object) -> bool:
        points = self.points()
        return rank == self.rank and all(
            p.footprint < points[key[1]].footprint for key, p in points.items()
            if key[:1] == ("gate",) and key[1] in points)


def relowered(column: Column, lowering: str, points: Callable[[], dict]) -> Column:
    """``column``'s plans, their regions lowered with ``lowering``: the same
    targets and plans (a column plans each target once), other compiled points.
    Walked for less recompute after an answer of ``column``'s rank: always under
    the conditional, which keeps fewer bytes than the gate's copies; gated,
    :class:`WhileGatedReadsLower`."""
    def plan(target: int) -> Candidate:
        cand = column.plan(target)
        result, small, _ = cand.payload
        return dataclasses.replace(cand, key=(lowering, cand.key) if cand.key else (),
                                   payload=(result, small, lowering))

    return dataclasses.replace(column, name=f"{column.name} ({lowering})", plan=plan,
                               rank=column.rank + 1, twin_of=column.name, walked_after=(
                                   frozenset({column.rank}) if lowering == "cond"
                                   else WhileGatedReadsLower(column.rank, points)))

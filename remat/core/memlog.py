"""The memory log: one line per step of a schedule, as a text table.

Columns: step, op id and label, the user source line, bytes defined, bytes freed,
bytes live while the op runs, and a ``remat`` column that plans fill in (for
example ``"recompute"`` or ``"keep"``); a ``*`` marks the peak step.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> from remat.core.simulate import simulate
    >>> b = GraphBuilder(); x = b.add_input(1024)
    >>> (y,) = b.add_op("sin", [x], [1024], source="demo.py:3")
    >>> g = b.build(outputs=[y])
    >>> print(memlog(g, simulate(g, (0,))))  # doctest: +NORMALIZE_WHITESPACE
    step  op  label  source     defined  freed  live  remat
    *0    0   sin    demo.py:3  0 B      0 B    2.0 KiB
"""

from __future__ import annotations

from typing import Mapping

from .graph import Graph
from .simulate import Timeline

__all__ = ["memlog", "format_bytes"]

_HEADER = ("step", "op", "label", "source", "defined", "freed", "live", "remat")


def format_bytes(nbytes: float) -> str:
    """``1536`` -> ``"1.5 KiB"``: a byte count in binary units."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{int(nbytes)} B" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def memlog(graph: Graph, timeline: Timeline,
           decisions: Mapping[int, str] | None = None, *, raw_bytes: bool = False) -> str:
    """The memory log of ``timeline`` as an aligned text table.

    Arguments:
      graph: the program the timeline was simulated on.
      timeline: from ``remat.core.simulate.simulate``.
      decisions: op id -> remat decision to print in the last column.
      raw_bytes: print exact byte counts instead of KiB/MiB.

    Returns:
      the table, one line per step, with a header line.
    """
    decisions = decisions or {}
    fmt = str if raw_bytes else format_bytes
    rows = [_HEADER]
    for step, op_id in enumerate(timeline.schedule):
        op = graph.ops[op_id]
        mark = "*" if step == timeline.peak_step else ""
        rows.append((f"{mark}{step}", str(op_id), op.label, op.source or "-",
                     fmt(timeline.defined_bytes[step]), fmt(timeline.freed_bytes[step]),
                     fmt(timeline.live_during_bytes[step]), decisions.get(op_id, "")))
    widths = [max(len(row[c]) for row in rows) for c in range(len(_HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in rows]
    return "\n".join(lines)

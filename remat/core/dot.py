"""DOT (Graphviz) text of a graph: sizes on every node, the peak marked, recomputed
ops highlighted.

Ops are boxes labelled with their label and the bytes they define; edges carry the
size of the value passed (fused values are dashed: they never reach memory). Program
inputs are ellipses. Given a timeline, the op running at the peak is red and the
values live there are bold; ops in ``recomputed`` are filled orange.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder(); x = b.add_input(8, name="x")
    >>> (y,) = b.add_op("sin", [x], [8])
    >>> print(to_dot(b.build(outputs=[y])).splitlines()[0])
    digraph remat {
"""

from __future__ import annotations

from typing import AbstractSet

from .fusion import fused_values
from .graph import Graph
from .memlog import format_bytes
from .simulate import Timeline

__all__ = ["to_dot"]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph: Graph, timeline: Timeline | None = None,
           recomputed: AbstractSet[int] = frozenset()) -> str:
    """The DOT text of ``graph``.

    Arguments:
      graph: the program.
      timeline: optional simulation; marks the peak op and the values live there.
      recomputed: ids of ops a plan recomputes; they are highlighted.

    Returns:
      a ``digraph`` that ``dot -Tsvg`` renders.
    """
    fused = fused_values(graph)
    peak_op = -1
    live_at_peak: set[int] = set()
    if timeline is not None and timeline.peak_step >= 0:
        peak_op = timeline.schedule[timeline.peak_step]
        live_at_peak = set(timeline.live_values_at(graph, timeline.peak_step))
    lines = ["digraph remat {", "  rankdir=TB;", "  node [fontname=Helvetica fontsize=10];"]
    for v in graph.inputs:
        value = graph.values[v]
        name = value.name or f"in{v}"
        lines.append(f"  v{v} [shape=ellipse label={_quote(f'{name} {format_bytes(value.nbytes)}')}];")
    for op_id, op in enumerate(graph.ops):
        nbytes = sum(graph.values[v].nbytes for v in op.outputs if not fused[v])
        attrs = [f"shape=box label={_quote(f'{op_id}: {op.label} {format_bytes(nbytes)}')}"]
        if op.source:
            attrs.append(f"tooltip={_quote(op.source)}")
        if op_id in recomputed:
            attrs.append("style=filled fillcolor=orange")
        if op_id == peak_op:
            attrs.append("color=red penwidth=3")
        lines.append(f"  op{op_id} [{' '.join(attrs)}];")
    for op_id, op in enumerate(graph.ops):
        for v in dict.fromkeys(op.inputs):
            producer = graph.values[v].producer
            source = f"v{v}" if producer is None else f"op{producer}"
            attrs = [f"label={_quote(format_bytes(graph.values[v].nbytes))}"]
            if fused[v]:
                attrs.append("style=dashed")
            if v in live_at_peak:
                attrs.append("penwidth=2.5")
            lines.append(f"  {source} -> op{op_id} [{' '.join(attrs)}];")
    for i, v in enumerate(dict.fromkeys(graph.outputs)):
        producer = graph.values[v].producer
        source = f"v{v}" if producer is None else f"op{producer}"
        lines.append(f"  out{i} [shape=doubleoctagon label={_quote(f'out {format_bytes(graph.values[v].nbytes)}')}];")
        lines.append(f"  {source} -> out{i};")
    lines.append("}")
    return "\n".join(lines)

"""Which values a fusing compiler never materializes.

XLA fuses chains of elementwise-like ops into one kernel ("loop fusion") and fuses
such chains into the reductions that consume them. A value passed from one fused op
to another lives in registers, never in memory. We model it per value, from the
graph alone (no schedule needed):

  a value is *fused* when its producer is a ``"loop"`` op, it is not a program
  output, it has at least one user, every user is a ``"loop"`` or ``"reduce"`` op,
  and either it has a single user or recomputing it in each user is cheap (no
  transcendentals: XLA duplicates cheap producers into several consumers, but not
  expensive ones).

A fused value occupies no bytes; the values its producer reads must stay live until
the fusion really runs, i.e. until the last op that consumes the fused chain (the
simulator handles that with *anchors*, see ``remat.core.simulate``).

Known gaps: XLA also folds transposes into dots, turns some reshapes into free
bitcasts, and refuses fusions that would grow too large; none of that is modelled.
"""

from __future__ import annotations

from .graph import Graph

__all__ = ["fused_values", "resident_bytes"]

_ABSORBS_FUSED_PRODUCERS = ("loop", "reduce")


def fused_values(graph: Graph) -> list[bool]:
    """For each value id, whether a fusing compiler keeps it out of memory."""
    cached = graph.__dict__.get("_fused_values")
    if cached is not None:
        return cached
    ops = graph.ops
    is_output = [False] * len(graph.values)
    for v in graph.outputs:
        is_output[v] = True
    fused = [False] * len(graph.values)
    for op in ops:
        if op.fusion != "loop":
            continue
        cheap = op.transcendentals == 0
        for v in op.outputs:
            users = graph.users[v]
            if is_output[v] or not users:
                continue
            if len(users) > 1 and not cheap:
                continue
            if all(ops[u].fusion in _ABSORBS_FUSED_PRODUCERS for u in users):
                fused[v] = True
    object.__setattr__(graph, "_fused_values", fused)
    return fused


def resident_bytes(graph: Graph) -> list[int]:
    """For each value id, the bytes it occupies once fusion is accounted for."""
    fused = fused_values(graph)
    return [0 if f else value.nbytes for f, value in zip(fused, graph.values)]

"""Which values a fusing compiler never materializes.

XLA fuses chains of elementwise-like ops into one kernel ("loop fusion") and fuses
such chains into the reductions that consume them. A value passed from one fused op
to another lives in registers, never in memory. We model it per value, from the
graph alone (no schedule needed):

  a value is *fused* when its producer is a ``"loop"`` op, it is not a program
  output, it has at least one user, every user is a ``"loop"`` or ``"reduce"`` op,
  and either all its users end up in one fusion (e.g. ``q`` in ``q + q * h``), or
  its producer is cheap to duplicate into each of them: it writes at least
  ``_EXPANSION`` times the bytes it reads (broadcasts, iotas). Measured on XLA:CPU,
  it does not duplicate other multi-user producers: without that rule the
  transformer benchmark was under-predicted by 21%.

A fused value occupies no bytes; the values its producer reads must stay live until
the fusion really runs, i.e. until the last op that consumes the fused chain (the
simulator handles that with *anchors*, see ``remat.core.simulate``).

Known gaps: XLA also folds some transposes into dots, turns some reshapes into free
bitcasts, reuses a dying operand's buffer for an elementwise result, and refuses
fusions that would grow too large; none of that is modelled.
"""

from __future__ import annotations

from .graph import Graph

__all__ = ["fused_values", "resident_bytes"]

_ABSORBS_FUSED_PRODUCERS = ("loop", "reduce")

#: A producer is duplicated into several consumers only when it writes at least this
#: many times the bytes it reads (broadcasts of scalars and rows, iotas).
_EXPANSION = 8


def fused_values(graph: Graph) -> list[bool]:
    """For each value id, whether a fusing compiler keeps it out of memory."""
    cached = graph.__dict__.get("_fused_values")
    if cached is not None:
        return cached
    ops = graph.ops
    values = graph.values
    users = graph.users
    is_output = [False] * len(values)
    for v in graph.outputs:
        is_output[v] = True
    fused = [False] * len(values)
    # fusion_of[op]: an id naming the fusion the op ends up in; ops that are not
    # fused into their users name their own fusion, and a duplicated producer gets
    # an id no other op has (it is in several fusions).
    fusion_of = list(range(len(ops)))
    absorbs = [op.fusion in _ABSORBS_FUSED_PRODUCERS for op in ops]
    for op_id in reversed(graph.topological_order):
        op = ops[op_id]
        if op.fusion != "loop" or not op.outputs:
            continue
        read_bytes = -1         # worked out when needed
        targets: set[int] = set()
        all_fused = True
        for v in op.outputs:
            readers = users[v]
            if is_output[v] or not readers or not all(map(absorbs.__getitem__, readers)):
                all_fused = False
                continue
            reader_fusions = {fusion_of[u] for u in readers}
            if len(reader_fusions) > 1:
                if read_bytes < 0:
                    read_bytes = sum(values[i].nbytes for i in set(op.inputs))
                if read_bytes * _EXPANSION > values[v].nbytes:
                    all_fused = False  # too costly to duplicate into several fusions
                    continue
            fused[v] = True
            targets |= reader_fusions
        if all_fused:
            fusion_of[op_id] = targets.pop() if len(targets) == 1 else -1 - op_id
    object.__setattr__(graph, "_fused_values", fused)
    return fused


def resident_bytes(graph: Graph) -> list[int]:
    """For each value id, the bytes it occupies once fusion is accounted for."""
    fused = fused_values(graph)
    return [0 if f else value.nbytes for f, value in zip(fused, graph.values)]

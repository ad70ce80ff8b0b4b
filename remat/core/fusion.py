"""Which values a fusing compiler never materializes.

XLA fuses chains of elementwise-like ops into one kernel ("loop fusion") and fuses
such chains into the reductions that consume them. A value passed from one fused op
to another lives in registers, never in memory. We model it per value, from the
graph alone (no schedule needed):

  a value is *fused* when its producer is a ``"loop"`` op, it is not a program
  output, it has at least one user, every user is a ``"loop"`` or ``"reduce"`` op,
  and either all its users end up in one fusion (e.g. ``q`` in ``q + q * h``), or
  its producer is cheap to duplicate into each of them: it writes at least
  ``_EXPANSION`` times the bytes it reads (broadcasts, iotas). XLA:CPU does not
  duplicate other multi-user producers, so their values stay in memory.

A fused value occupies no bytes; the values its producer reads must stay live until
the fusion really runs, i.e. until the last op that consumes the fused chain (the
simulator handles that with *anchors*, see ``remat.core.simulate``).

Known gaps: XLA also folds some transposes into dots, turns some reshapes into free
bitcasts, reuses a dying operand's buffer for an elementwise result, and refuses
fusions that would grow too large; none of that is modelled.
"""

from __future__ import annotations

from .graph import Graph

__all__ = ["fused_values", "fused_ops", "resident_bytes"]

_ABSORBS_FUSED_PRODUCERS = ("loop", "reduce")

#: A producer is duplicated into several consumers only when it writes at least this
#: many times the bytes it reads (broadcasts of scalars and rows, iotas).
_EXPANSION = 8


def fused_values(graph: Graph) -> list[bool]:
    """For each value id, whether a fusing compiler keeps it out of memory."""
    return _fusion(graph)[0]


def fused_ops(graph: Graph) -> list[bool]:
    """For each op id, whether it runs inside the fusion of the ops reading its
    results (every value it defines is fused), so at the last of them."""
    return [fusion != op for op, fusion in enumerate(_fusion(graph)[1])]


def _fusion(graph: Graph) -> tuple[list[bool], list[int]]:
    """Each value's fused flag and each op's fusion id, worked out once per
    graph. A graph a plan rewrote (:meth:`Graph.rewired`) starts from its
    base's and redoes only the ops whose readers changed, and those upstream of
    them whose fusion changed in turn (the answer is the same as from scratch:
    an op's fusion depends only on its values' readers)."""
    known = graph.__dict__.get("_fusion")
    if known is None:
        if graph.rewired_from is None:
            known = _fusion_from_scratch(graph)
        else:
            known = _fusion_after_rewiring(graph, *graph.rewired_from)
        object.__setattr__(graph, "_fusion", known)
    return known


def _fusion_from_scratch(graph: Graph) -> tuple[list[bool], list[int]]:
    """Each value's fused flag, and each op's fusion id (see :func:`_settle`)."""
    fused = [False] * len(graph.values)
    fusion_of = list(range(len(graph.ops)))
    ops = graph.ops
    # last one first: in reverse topological order, an op's readers are settled
    # before it, and nothing is settled twice
    _settle(graph, [o for o in graph.topological_order if ops[o].fusion == "loop"],
            fused, fusion_of, upstream=False)
    return fused, fusion_of


def _fusion_after_rewiring(graph: Graph, base: Graph, changed: tuple[int, ...]
                           ) -> tuple[list[bool], list[int]]:
    """:func:`_fusion_from_scratch` of ``graph``, made from ``base`` by appending
    ops and values and rewiring the ops in ``changed``, redoing only what moved."""
    n_old = len(base.ops)
    if 2 * len(changed) > n_old:   # (starting over costs less)
        return _fusion_from_scratch(graph)
    fused_before, fusion_before = _fusion(base)
    ops, values = graph.ops, graph.values
    fused = fused_before + [False] * (len(values) - len(base.values))
    fusion_of = fusion_before + list(range(n_old, len(ops)))
    # ops to settle again: the new ones, and the producers of every value
    # whose readers changed
    dirty = set()
    for o in changed:
        if o >= n_old:
            dirty.add(o)
        else:
            dirty.update(values[v].producer for v in base.ops[o].inputs)
        dirty.update(values[v].producer for v in ops[o].inputs)
    dirty.discard(None)
    # in topological order, so that (last first) an op's readers are settled first
    _settle(graph, [o for o in graph.topological_order
                    if o in dirty and ops[o].fusion == "loop"], fused, fusion_of,
            upstream=True)
    return fused, fusion_of


def _settle(graph: Graph, stack: list[int], fused: list[bool],
            fusion_of: list[int], upstream: bool) -> None:
    """Settles the ``"loop"`` ops on ``stack``, last first (and with
    ``upstream``, again any op upstream whose readers' fusion moved): sets
    ``fused`` for each one's values from their readers' fusions, and its fusion
    id: its own id if it is not fused into its readers, a reader's fusion if all
    of them are in that one, or an id no other op has if it is duplicated into
    several."""
    ops, values, users = graph.ops, graph.values, graph.users
    outputs = set(graph.outputs)
    pending = set(stack) if upstream else set()     # on the stack
    while stack:
        op_id = stack.pop()
        pending.discard(op_id)
        op = ops[op_id]
        read_bytes = -1         # worked out when needed
        targets: set[int] = set()
        all_fused = bool(op.outputs)
        for v in op.outputs:
            fused[v] = False
            readers = users[v]
            if v in outputs or not readers or not all(
                    ops[u].fusion in _ABSORBS_FUSED_PRODUCERS for u in readers):
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
        if not all_fused:
            fusion = op_id
        else:
            fusion = targets.pop() if len(targets) == 1 else -1 - op_id
        if fusion == fusion_of[op_id]:
            continue
        fusion_of[op_id] = fusion
        if upstream:
            for v in op.inputs:
                p = values[v].producer
                if p is not None and p not in pending and ops[p].fusion == "loop":
                    pending.add(p)
                    stack.append(p)


def resident_bytes(graph: Graph) -> list[int]:
    """For each value id, the bytes it occupies once fusion is accounted for."""
    fused = fused_values(graph)
    return [0 if f else value.nbytes for f, value in zip(fused, graph.values)]

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
  duplicate other multi-user producers, so their values stay in memory, unless
  the compiled program showed it does: a ``"copied"`` op (an elementwise op XLA
  computed again inside each fusion reading it, and never stored) is fused into
  several readers like a broadcast, whatever its bytes.

A fused value occupies no bytes; the values its producer reads must stay live until
the fusion really runs, i.e. until the last op that consumes the fused chain (the
simulator handles that with *anchors*, see ``remat.core.simulate``).

Known gaps: XLA also folds some transposes into dots, turns some reshapes into free
bitcasts, reuses a dying operand's buffer for an elementwise result, and refuses
fusions that would grow too large; none of that is modelled.

A graph's fusion is worked out once, when the graph is made (``Graph.fusion``, a
:class:`Fusion`); the functions below read it.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_input(400)
    >>> (y,) = b.add_op("sin", [x], [400], fusion="loop")
    >>> (z,) = b.add_op("reduce_sum", [y], [4], fusion="reduce")
    >>> fused_values(b.build(outputs=[z]))     # y never exists in memory
    (False, True, False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

if TYPE_CHECKING:       # graph.py works out a graph's fusion when it is made
    from .graph import Graph

__all__ = ["Fusion", "fusion_of", "fused_values", "fused_ops", "resident_bytes"]

#: Ops whose results may be fused into their readers.
_FUSES_INTO_READERS = ("loop", "copied")
_ABSORBS_FUSED_PRODUCERS = ("loop", "copied", "reduce")

#: A producer is duplicated into several consumers only when it writes at least this
#: many times the bytes it reads (broadcasts of scalars and rows, iotas).
_EXPANSION = 8


class Fusion(NamedTuple):
    """The fusion of one graph (``Graph.fusion``, worked out when it is made).

    Attributes:
      fused: for each value id, whether a fusing compiler keeps it out of memory.
      fusion_id: for each op id, its own id if it is not fused into its readers,
        a reader's fusion id if all of them are in that one, or an id no other op
        has (negative) if it is duplicated into several.
      in_fusion: for each op id, whether it runs inside the fusion of the ops
        reading its results (every value it defines is fused), so at the last
        of them.
      resident: for each value id, the bytes it occupies (0 if fused).
    """

    fused: tuple[bool, ...]
    fusion_id: tuple[int, ...]
    in_fusion: tuple[bool, ...]
    resident: tuple[int, ...]


def fused_values(graph: Graph) -> tuple[bool, ...]:
    """For each value id, whether a fusing compiler keeps it out of memory."""
    return graph.fusion.fused


def fused_ops(graph: Graph) -> tuple[bool, ...]:
    """For each op id, whether it runs inside the fusion of the ops reading its
    results (every value it defines is fused), so at the last of them."""
    return graph.fusion.in_fusion


def resident_bytes(graph: Graph) -> tuple[int, ...]:
    """For each value id, the bytes it occupies once fusion is accounted for."""
    return graph.fusion.resident


def fusion_of(graph: Graph, base: Graph | None = None,
              changed: Sequence[int] = ()) -> Fusion:
    """The fusion of ``graph``, whose other derived fields are set. For a graph
    made from ``base`` by appending ops and values and rewiring the ops in
    ``changed`` (:meth:`Graph.rewired`), it starts from ``base``'s and redoes
    only the ops whose readers changed, and those upstream of them whose fusion
    changed in turn (the answer is the same as from scratch: an op's fusion
    depends only on its values' readers)."""
    if base is None or 2 * len(changed) > len(base.ops):   # (starting over costs less)
        fused, fusion_id = _fusion_from_scratch(graph)
    else:
        fused, fusion_id = _fusion_after_rewiring(graph, base, changed)
    return Fusion(tuple(fused), tuple(fusion_id),
                  tuple(f != op for op, f in enumerate(fusion_id)),
                  tuple(0 if f else value.nbytes for f, value in zip(fused, graph.values)))


def _fusion_from_scratch(graph: Graph) -> tuple[list[bool], list[int]]:
    """Each value's fused flag, and each op's fusion id (see :func:`_settle`)."""
    fused = [False] * len(graph.values)
    fusion_id = list(range(len(graph.ops)))
    ops = graph.ops
    # last one first: in reverse topological order, an op's readers are settled
    # before it, and nothing is settled twice
    _settle(graph, [o for o in graph.topological_order
                    if ops[o].fusion in _FUSES_INTO_READERS],
            fused, fusion_id, upstream=False)
    return fused, fusion_id


def _fusion_after_rewiring(graph: Graph, base: Graph, changed: Sequence[int]
                           ) -> tuple[list[bool], list[int]]:
    """:func:`_fusion_from_scratch` of ``graph``, made from ``base`` by appending
    ops and values and rewiring the ops in ``changed``, redoing only what moved."""
    n_old = len(base.ops)
    ops, values = graph.ops, graph.values
    fused = list(base.fusion.fused) + [False] * (len(values) - len(base.values))
    fusion_id = list(base.fusion.fusion_id) + list(range(n_old, len(ops)))
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
                    if o in dirty and ops[o].fusion in _FUSES_INTO_READERS],
            fused, fusion_id, upstream=True)
    return fused, fusion_id


def _settle(graph: Graph, stack: list[int], fused: list[bool],
            fusion_id: list[int], upstream: bool) -> None:
    """Settles the ``"loop"`` and ``"copied"`` ops on ``stack``, last first (and with
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
            reader_fusions = {fusion_id[u] for u in readers}
            if len(reader_fusions) > 1 and op.fusion != "copied":
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
        if fusion == fusion_id[op_id]:
            continue
        fusion_id[op_id] = fusion
        if upstream:
            for v in op.inputs:
                p = values[v].producer
                if (p is not None and p not in pending
                        and ops[p].fusion in _FUSES_INTO_READERS):
                    pending.add(p)
                    stack.append(p)

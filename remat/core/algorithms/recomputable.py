"""Which ops may run twice: everything but effects, non-deterministic ops and loops,
and the producers of a max-pool backward's operand."""

from __future__ import annotations

from ..graph import Graph

#: Ops whose second run could differ from the first or repeat an effect, and
#: loops: a ``scan``'s body is planned as a loop of its own (``loop_plan``), and
#: a ``while``'s trip count is unknown, so what a second run costs is too. A
#: conditional may run twice where what it holds may (``Op.repeatable``).
NOT_RECOMPUTABLE = frozenset({
    "rng_uniform", "rng_bit_generator", "random_seed", "io_callback",
    "debug_callback", "debug_print", "pure_callback", "infeed", "outfeed",
    "send", "recv", "while", "scan", "get", "swap", "addupdate",
    "new_ref", "freeze", "all_reduce", "psum", "all_gather", "all_to_all",
    "ppermute", "reduce_scatter", "psum_scatter",
})

#: Operands whose producers are never recomputed, by op and operand position.
#: XLA:CPU expands ``select_and_scatter_add(source, operand)`` (a max-pool's
#: backward) into a reduce-window over one int32 iota per dimension of the
#: operand, and schedules those iotas early. Fed the operand of the forward pass,
#: the reduce-window runs there and its indices are kept; fed a recomputed
#: operand in the backward pass, the iotas (4 bytes per element of the operand
#: per dimension) are held from the forward pass to there. The rule holds on
#: every backend (the core does not know which): elsewhere it only keeps one
#: value per max-pool that a plan could have recomputed.
OPERANDS_KEPT = {"select_and_scatter_add": (1,)}


def recomputable(graph: Graph, op_id: int) -> bool:
    """Whether ``op_id`` may be recomputed.

    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_input(64)
    >>> (y,) = b.add_op("max", [x], [64])
    >>> (p,) = b.add_op("reduce_window_max", [y], [16])
    >>> (t,) = b.add_op("neg", [p], [16])      # (the cotangent, in a gradient)
    >>> (g,) = b.add_op("select_and_scatter_add", [t, y], [64])
    >>> graph = b.build(outputs=[g])
    >>> [recomputable(graph, o) for o in range(4)]   # max's result is kept
    [False, True, True, True]
    >>> (c,) = b.add_op("cond", [x], [64], repeatable=False)   # (a branch prints)
    >>> recomputable(b.build(outputs=[c]), 4)
    False
    """
    op = graph.ops[op_id]
    if op.label in NOT_RECOMPUTABLE or not op.repeatable:
        return False
    users, ops = graph.users, graph.ops
    return not any(ops[u].inputs[k] == v for v in op.outputs for u in users[v]
                   for k in OPERANDS_KEPT.get(ops[u].label, ()))

"""Traversal helpers shared by the schedulers."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from ..graph import Graph


def root_ops(graph: Graph) -> list[int]:
    """Ops to start a backwards traversal from: producers of the outputs, in output
    order, then the ops whose results nobody reads (in reverse id order)."""
    roots: list[int] = []
    seen = [False] * len(graph.ops)
    for v in graph.outputs:
        p = graph.values[v].producer
        if p is not None and not seen[p]:
            seen[p] = True
            roots.append(p)
    for op_id in range(len(graph.ops) - 1, -1, -1):
        if not seen[op_id] and not graph.op_successors(op_id):
            seen[op_id] = True
            roots.append(op_id)
    return roots


def post_order(graph: Graph, roots: Iterable[int],
               operands_in_visit_order: Callable[[int], Sequence[int]]) -> tuple[int, ...]:
    """Iterative depth-first post-order over producers, starting from ``roots``.

    ``operands_in_visit_order(op)`` lists the producer ops of ``op``'s operands in
    the order they should be visited (and therefore scheduled).
    """
    done = [False] * len(graph.ops)
    order: list[int] = []
    for root in roots:
        if done[root]:
            continue
        stack: list[tuple[int, Iterable[int]]] = [(root, iter(operands_in_visit_order(root)))]
        on_stack = {root}
        while stack:
            op_id, pending = stack[-1]
            for pred in pending:
                if not done[pred] and pred not in on_stack:
                    on_stack.add(pred)
                    stack.append((pred, iter(operands_in_visit_order(pred))))
                    break
            else:
                stack.pop()
                on_stack.discard(op_id)
                done[op_id] = True
                order.append(op_id)
    # Every op is reachable from some root (a DAG's sinks), so order is complete.
    return tuple(order)

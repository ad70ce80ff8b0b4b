"""List scheduler, in the spirit of XLA's ``ListMemoryScheduler``.

Greedy and forward: among the ops whose operands are all computed, run the one with
the largest *bytes freed minus bytes defined*, where an op frees an operand when it
is that operand's last unscheduled reader. Priorities are updated as readers are
scheduled (an op becomes the last reader of a value when its co-readers have run).
Ties go to the op that comes first in program order.
"""

from __future__ import annotations

import heapq

from ..fusion import resident_bytes
from ..graph import Graph

__all__ = ["list_schedule"]


def list_schedule(graph: Graph) -> tuple[int, ...]:
    """Schedules ``graph`` greedily by bytes freed minus bytes defined.

    Example::

        >>> from remat.core.graph import GraphBuilder
        >>> b = GraphBuilder(); x = b.add_input(4)
        >>> (big,) = b.add_op("big", [x], [400]); (small,) = b.add_op("small", [x], [4])
        >>> (y,) = b.add_op("shrink", [big], [4])
        >>> list_schedule(b.build(outputs=[y, small]))
        (1, 0, 2)
    """
    ops = graph.ops
    users = graph.users
    values = graph.values
    resident = resident_bytes(graph)
    n = len(ops)

    freeable = [True] * len(values)
    for v in graph.outputs:
        freeable[v] = False
    for v in graph.inputs:
        if v not in graph.donated:
            freeable[v] = False
    remaining_readers = [len(u) for u in users]
    waiting_on = [len(graph.op_predecessors(o)) for o in range(n)]
    allocated = list(resident)
    for v in graph.outputs:
        allocated[v] = 0  # result buffers are allocated up front (see simulate)
    defined = [sum(allocated[v] for v in op.outputs) for op in ops]
    scheduled = [False] * n
    ready = [False] * n
    priority = [0] * n

    def compute_priority(op_id: int) -> int:
        freed = 0
        seen: set[int] = set()
        for v in ops[op_id].inputs:
            if v not in seen and freeable[v] and remaining_readers[v] == 1:
                freed += resident[v]
            seen.add(v)
        return freed - defined[op_id]

    heap: list[tuple[int, int]] = []

    def push(op_id: int) -> None:
        priority[op_id] = compute_priority(op_id)
        heapq.heappush(heap, (-priority[op_id], op_id))

    for op_id in range(n):
        if waiting_on[op_id] == 0:
            ready[op_id] = True
            push(op_id)

    order: list[int] = []
    while heap:
        neg_priority, op_id = heapq.heappop(heap)
        if scheduled[op_id] or -neg_priority != priority[op_id]:
            continue  # a stale entry
        scheduled[op_id] = True
        order.append(op_id)
        op = ops[op_id]
        for v in set(op.inputs):
            remaining_readers[v] -= 1
            if remaining_readers[v] == 1 and freeable[v]:
                for u in users[v]:
                    if not scheduled[u]:
                        if ready[u]:
                            push(u)  # it now frees v: re-rank it
                        break
        for s in graph.op_successors(op_id):
            waiting_on[s] -= 1
            if waiting_on[s] == 0:
                ready[s] = True
                push(s)
    return tuple(order)

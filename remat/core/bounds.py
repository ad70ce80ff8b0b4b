"""Lower bounds on the footprint a plan can reach.

:func:`planner_floor` bounds what *this* planner can do on a schedule. A plan keeps
the schedule's order (regions only add recomputation before late readers), never
drops a value under ``small_node_bytes`` or one whose producer may not run twice,
and every op holds its operands, results and scratch while it runs. So at each
step a plan holds at least the program's inputs and outputs, every value it may
not drop that is live across the step, and the op's own operands and results. The
largest such figure over the steps is the floor: a limit below it is out of reach
whatever the algorithm, and lowering ``small_node_bytes`` is the only way down.

Cost: O(ops + edges).

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> from remat.core.simulate import simulate
    >>> b = GraphBuilder()
    >>> x = b.add_input(10)
    >>> (a,) = b.add_op("f", [x], [100])
    >>> (c,) = b.add_op("f", [a], [100])
    >>> (y,) = b.add_op("g", [c], [10])
    >>> (z,) = b.add_op("h", [y, a], [10])
    >>> g = b.build(outputs=[z])
    >>> tl = simulate(g, (0, 1, 2, 3))
    >>> tl.peak_bytes, planner_floor(g, tl, 0), planner_floor(g, tl, 1000)
    (230, 220, 230)
"""

from __future__ import annotations

from collections.abc import Callable

from .graph import Graph
from .simulate import Timeline, donated_aliases

__all__ = ["planner_floor"]


def planner_floor(graph: Graph, timeline: Timeline, small_node_bytes: int,
                  allows: Callable[[Graph, int], bool] | None = None) -> int:
    """The least peak any plan over ``timeline``'s schedule can have, when values
    under ``small_node_bytes`` and those of ops ``allows`` refuses are kept."""
    if allows is None:
        from .algorithms.recomputable import recomputable
        allows = recomputable
    schedule = timeline.schedule
    n = len(schedule)
    fixed = set(graph.inputs) | set(graph.outputs)
    donated = set(graph.donated)     # value ids of donated inputs
    held = sum(graph.values[v].nbytes for v in fixed if v not in donated)

    aliased = donated_aliases(graph)    # in their results' buffers (held)

    def costs(v: int) -> bool:     # (a plan may fuse a "copied" op's value anew)
        producer = graph.values[v].producer
        return not (timeline.fused[v] or timeline.in_output_buffer[v] or v in aliased
                    or producer is not None and graph.ops[producer].fusion == "copied")

    # bytes of kept values live strictly between their definition and last use
    across = [0] * (n + 1)
    kept: set[int] = set()
    born = [-1] * len(graph.values)
    for step, op in enumerate(schedule):
        for v in graph.ops[op].outputs:
            born[v] = step
    for v, value in enumerate(graph.values):
        last = timeline.last_use_step[v]
        if v in fixed and v not in donated or not costs(v) or last < 0:
            continue
        if (value.producer is None or value.nbytes < small_node_bytes or
                not allows(graph, value.producer)) and last - born[v] > 1:
            kept.add(v)
            across[born[v] + 1] += value.nbytes
            across[last] -= value.nbytes
    floor = held
    running = 0
    for step, op_id in enumerate(schedule):
        running += across[step]
        op = graph.ops[op_id]
        own = {v for v in (*op.inputs, *op.outputs)
               if (v not in fixed or v in donated) and costs(v) and not (
                   v in kept and born[v] < step < timeline.last_use_step[v])}
        here = sum(graph.values[v].nbytes for v in own) + op.working_set_bytes
        floor = max(floor, held + running + here)
    return floor

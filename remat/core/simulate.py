"""The memory simulator: bytes live at each step of a schedule.

Every planning algorithm measures a schedule through :func:`simulate`, so that all of
them agree on what "peak memory" means. The model, chosen to predict the footprint
XLA reports (``argument + output + temp - alias`` bytes of ``memory_analysis()``):

* **Program inputs** are live for the whole program: the caller owns them. A
  *donated* input is freed after its last use instead; and one that a result is
  written into (:func:`donated_aliases`, as JAX pairs them) shares that result's
  buffer: it costs nothing of its own, except while the result, written before
  the input's last read, needs a second buffer.
* **Program outputs** occupy their own buffers for the whole program: XLA allocates
  result buffers apart from its temporaries (``output_size_in_bytes``).
* **Temporaries inside result buffers** (with ``reuse_result_buffers=True``): before
  a result is written, XLA's buffer assignment lets a temporary that fits (and dies
  before the result is defined) live in the result's buffer, one at a time: it
  then costs nothing. Seen on XLA:CPU: saved activations inside the buffers of
  weight gradients. We place temporaries largest first, each in the smallest
  result buffer that takes it.
* **Every other value** is allocated when the op that defines it runs and freed right
  after the op that reads it last. A value nobody reads is freed right after it is
  defined.
* **Fusion** (``remat.core.fusion``): values passed between fused elementwise ops take
  no memory. The fused ops of a chain really run at the op that consumes the chain
  (its *anchor*), so the inputs of a fused op stay live until that anchor runs.
* **During an op**, its inputs and its outputs are live together, plus its
  ``working_set_bytes`` (the body of a loop or a conditional); then the inputs it was
  the last reader of are freed. The peak is the largest "during" figure.

Hazards: the compiler schedules the program itself (we predict with the best of our
schedulers, as XLA's default scheduler does); its heap can fragment (we assume it
does not); it may reuse an operand's buffer for an elementwise result (we do not
count that saving); CSE and algebraic simplification may remove ops we count, or
add buffers (XLA:CPU's YNN fusions take materialized broadcast constants: a
forward-only transformer is under-predicted by ~40% for that reason). Measured
accuracy: ``bench/results/analyze.md``.

Cost: O(ops + edges) with plain lists, plus sorting the temporaries for the
result-buffer placement; 20,000 ops simulate in tens of milliseconds.

Example::

    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.add_input(100)
    >>> (y,) = b.add_op("dot", [x], [200])
    >>> (z,) = b.add_op("dot", [y], [50])
    >>> simulate(b.build(outputs=[z]), (0, 1)).peak_bytes  # x + z from the start, + y
    350
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Sequence

from .fusion import fused_ops, fused_values, resident_bytes
from .graph import Graph

__all__ = ["Timeline", "simulate", "check_schedule", "ScheduleError", "anchor_steps",
           "donated_aliases"]


class ScheduleError(ValueError):
    """A schedule is not a topological order of every op of its graph."""


@dataclasses.dataclass(frozen=True)
class Timeline:
    """What :func:`simulate` measured; lists are indexed by step (position in schedule).

    Attributes:
      schedule: the op ids in the order they run.
      defined_bytes: bytes allocated by the op at each step.
      freed_bytes: bytes freed right after each step.
      live_during_bytes: bytes live while each step runs (inputs, outputs, scratch).
      live_after_bytes: bytes live after each step (and its frees).
      peak_bytes: the largest ``live_during_bytes`` (or the input bytes if no ops).
      peak_step: the step where the peak is reached (-1 if no ops).
      input_bytes: bytes of the program inputs, live from the start.
      output_bytes: bytes of the program outputs that are not inputs, live from the
        start too (their own buffers).
      fused: for each value id, whether fusion keeps it out of memory.
      last_use_step: for each value id, the step after which it is freed (-1 for
        values that are never freed: non-donated inputs and program outputs).
      in_output_buffer: for each value id, whether it lives inside a program
        output's buffer before that output is written (so it costs nothing).
    """

    schedule: tuple[int, ...]
    defined_bytes: list[int]
    freed_bytes: list[int]
    live_during_bytes: list[int]
    live_after_bytes: list[int]
    peak_bytes: int
    peak_step: int
    input_bytes: int
    output_bytes: int
    fused: Sequence[bool]
    last_use_step: list[int]
    in_output_buffer: list[bool]

    def live_values_at(self, graph: Graph, step: int) -> list[int]:
        """Ids of the values occupying memory while ``step`` runs (O(values))."""
        defined_at = [-1] * len(graph.values)
        for s, op_id in enumerate(self.schedule):
            for v in graph.ops[op_id].outputs:
                defined_at[v] = s
        for v in graph.outputs:
            defined_at[v] = -1  # result buffers exist from the start
        live = []
        for v, value in enumerate(graph.values):
            if self.fused[v] or self.in_output_buffer[v] or value.nbytes == 0:
                continue
            born = defined_at[v]
            dies = self.last_use_step[v]
            if born <= step and (dies == -1 or dies >= step):
                live.append(v)
        return live


def check_schedule(graph: Graph, schedule: Sequence[int]) -> None:
    """Raises :class:`ScheduleError` unless ``schedule`` runs every op once, in order."""
    n = len(graph.ops)
    if len(schedule) != n:
        raise ScheduleError(f"the schedule has {len(schedule)} steps but the graph has "
                            f"{n} ops; a schedule runs every op exactly once.")
    position = [-1] * n
    for step, op_id in enumerate(schedule):
        if not 0 <= op_id < n or position[op_id] != -1:
            raise ScheduleError(f"step {step} runs op {op_id}, which is not an op id or "
                                "runs twice.")
        position[op_id] = step
    values = graph.values
    for step, op_id in enumerate(schedule):
        for v in graph.ops[op_id].inputs:
            p = values[v].producer
            if p is not None and position[p] > step:
                raise ScheduleError(f"op {op_id} ({graph.ops[op_id].label}) runs at step "
                                    f"{step} but reads value {v}, defined later by op {p} "
                                    f"at step {position[p]}.")


def simulate(graph: Graph, schedule: Sequence[int], *, check: bool = True,
             reuse_result_buffers: bool = False) -> Timeline:
    """Simulates the memory of running ``graph``'s ops in ``schedule`` order.

    Arguments:
      graph: the program.
      schedule: every op id once, in a topological order (e.g. from a scheduler).
      check: verify that ``schedule`` is a topological order (O(ops + edges)).
      reuse_result_buffers: let temporaries live in result buffers not yet written
        (see the module docstring). Closer to XLA (``remat.analyze`` turns it on);
        off by default because planning algorithms that estimate savings per value
        must then skip values that cost nothing (``Timeline.in_output_buffer``).

    Returns:
      a :class:`Timeline` (see the module docstring for the memory model). It is
      worked out anew at each call: planners that need the simulation of one
      order many times keep it in a :class:`remat.core.scheduled.Scheduled`.
    """
    schedule = tuple(schedule)
    if check:
        check_schedule(graph, schedule)
    return _simulate(graph, schedule, reuse_result_buffers)


def donated_aliases(graph: Graph) -> dict[int, int]:
    """For each donated input that a program output is written into, that output,
    paired as JAX pairs them: each output in turn takes the first donated input
    not taken yet with its shape and dtype (``Value.shape``; values without one
    are not paired). Only pairs of a read input and a computed output count.

    >>> from remat.core.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> w = b.add_input(64, shape="f32[4,4]", donated=True)
    >>> (u,) = b.add_op("sub", [w], [64], output_shapes=["f32[4,4]"])
    >>> donated_aliases(b.build(outputs=[u]))
    {0: 1}
    """
    waiting: dict[str, list[int]] = {}
    for v in graph.inputs:
        if v in graph.donated and graph.values[v].shape:
            waiting.setdefault(graph.values[v].shape, []).append(v)
    pairs = {}
    for o in graph.outputs:
        queue = waiting.get(graph.values[o].shape) if graph.values[o].shape else None
        if queue:
            d = queue.pop(0)
            if graph.values[o].producer is not None and graph.users[d]:
                pairs[d] = o
    return pairs


def anchor_steps(graph: Graph, schedule: Sequence[int]) -> list[int]:
    """For each op id, the step of ``schedule`` at which it really runs: a fused
    op runs with the last op that consumes the chain it belongs to."""
    ops, users = graph.ops, graph.users
    in_fusion = fused_ops(graph)
    anchor = [0] * len(ops)
    step = len(schedule)
    for op_id in reversed(schedule):
        step -= 1
        if in_fusion[op_id]:
            outs = ops[op_id].outputs
            if len(outs) == 1:
                anchor[op_id] = max(map(anchor.__getitem__, users[outs[0]]))
            else:
                anchor[op_id] = max(anchor[u] for v in outs for u in users[v])
        else:
            anchor[op_id] = step
    return anchor


def _simulate(graph: Graph, schedule: tuple[int, ...], reuse_result_buffers: bool
              ) -> Timeline:
    ops = graph.ops
    users = graph.users
    values = graph.values
    n_steps = len(schedule)
    n_values = len(values)
    fused = fused_values(graph)
    resident = resident_bytes(graph)

    anchor = anchor_steps(graph, schedule)

    input_set = set(graph.inputs)
    output_set = set(graph.outputs) - input_set
    donated = graph.donated
    never_freed = [False] * n_values
    for v in graph.outputs:
        never_freed[v] = True
    for v in input_set:
        if v not in donated:
            never_freed[v] = True

    # Each temporary's life: [defined_at, last_use_step].
    defined_at = [-1] * n_values
    last_use_step = [-1] * n_values
    freed: list[int] = []       # the values freed at some step
    for v in range(n_values):
        if never_freed[v] or fused[v]:
            continue
        p = values[v].producer
        readers = users[v]
        if readers:
            last = max(map(anchor.__getitem__, readers))
        elif p is not None:
            last = anchor[p]
        else:
            continue  # an unread donated input is free from the start
        last_use_step[v] = last
        freed.append(v)
        if p is not None:
            defined_at[v] = anchor[p]

    # A donated input a result is written into lives in that result's buffer; it
    # takes a buffer of its own only from that result's step to its last read.
    aliases = donated_aliases(graph)
    apart = [0] * n_steps       # bytes of such inputs held apart, from each step
    busy_until: dict[int, int] = {}     # result -> last step its buffer holds the input
    shared = set()                      # inputs that never take a buffer of their own
    for d, o in aliases.items():
        written = anchor[values[o].producer]
        if written < last_use_step[d]:
            apart[written] += resident[d]
        else:
            shared.add(d)
        busy_until[o] = last_use_step[d]
    if shared:                          # (one pass: a step has many donated inputs)
        freed = [v for v in freed if v not in shared]
    allocated = list(resident)
    for v in output_set:
        allocated[v] = 0  # allocated up front
    if reuse_result_buffers:
        in_output_buffer = _place_in_output_buffers(graph, anchor, resident, defined_at,
                                                    last_use_step, output_set, busy_until)
        for v in range(n_values):
            if in_output_buffer[v]:
                allocated[v] = 0
    else:
        in_output_buffer = [False] * n_values
    # (a freed value is no output; an input's bytes go when it is freed)
    freed_bytes = [0] * n_steps
    for v in freed:
        freed_bytes[last_use_step[v]] += (
            allocated[v] if values[v].producer is not None else resident[v])

    input_bytes = sum(values[v].nbytes for v in input_set)
    output_bytes = sum(values[v].nbytes for v in output_set)
    unread_donated = sum(values[v].nbytes for v in input_set
                         if v in donated and not users[v])
    live = input_bytes + output_bytes - unread_donated - sum(
        values[d].nbytes for d in aliases)
    defined_bytes = [0] * n_steps
    live_during = [0] * n_steps
    live_after = [0] * n_steps
    peak, peak_step = live, -1
    for step in range(n_steps):
        op = ops[schedule[step]]
        defined = apart[step]
        for v in op.outputs:
            defined += allocated[v]
        during = live + defined + op.working_set_bytes
        defined_bytes[step] = defined
        live_during[step] = during
        if during > peak or peak_step == -1:  # live never exceeds the last "during"
            peak, peak_step = during, step
        live = live + defined - freed_bytes[step]
        live_after[step] = live
    return Timeline(schedule, defined_bytes, freed_bytes, live_during, live_after,
                    peak, peak_step, input_bytes, output_bytes, fused, last_use_step,
                    in_output_buffer)


#: How many candidate output buffers to try for one temporary before giving up.
_MAX_BUFFER_TRIES = 32


def _place_in_output_buffers(graph: Graph, anchor: list[int], resident: list[int],
                             defined_at: list[int], last_use_step: list[int],
                             output_set: set[int], busy_until: dict[int, int]
                             ) -> list[bool]:
    """Which temporaries live inside a result buffer that is not written yet.

    Like XLA's buffer assignment: a result buffer holds one value at a time, at its
    start; a temporary fits if it is no larger, dies before the result is defined,
    is born after the donated input the buffer holds (``busy_until``) is last
    read, and its life does not overlap another temporary placed there. Largest
    temporaries are placed first, each in the smallest buffer that takes it.
    """
    hosted = [False] * len(graph.values)
    if not output_set:
        return hosted
    slots = sorted((graph.values[o].nbytes, anchor[graph.values[o].producer], o)
                   for o in output_set if graph.values[o].producer is not None)
    slot_sizes = [size for size, _, _ in slots]
    occupied: list[list[tuple[int, int]]] = [[] for _ in slots]
    temporaries = sorted((v for v in range(len(graph.values))
                          if defined_at[v] >= 0 and resident[v] > 0),
                         key=lambda v: (-resident[v], defined_at[v]))
    for v in temporaries:
        size, born, dies = resident[v], defined_at[v], last_use_step[v]
        first = bisect.bisect_left(slot_sizes, size)
        for k in range(first, min(len(slots), first + _MAX_BUFFER_TRIES)):
            if slots[k][1] <= dies or born <= busy_until.get(slots[k][2], -1):
                continue  # the result is written before the temporary dies, or
                          # the buffer still holds the donated input it aliases
            if any(b <= dies and born <= e for b, e in occupied[k]):
                continue
            occupied[k].append((born, dies))
            hosted[v] = True
            break
    return hosted

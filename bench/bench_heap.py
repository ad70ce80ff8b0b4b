"""Benchmark: XLA's temp heap against the bytes its buffers hold at once.

XLA's footprint (``memory_analysis()``) counts the temp heap its buffer assignment
lays out. The assignment places buffers one by one, each in the best-fitting gap
free over its whole live range (largest or longest first, not in time order), so
the heap can be larger than the most bytes live at any one time: holes. This
measures both for the plans the automatic pass tries at 30% on the programs of
``bench_optimal`` (the limits refused or met by a hair there): each plan is
compiled with XLA's dump on, and the live ranges of the buffer assignment give
the bytes the temp heap's buffers hold at each point of XLA's own schedule.

* the 12-layer chain: the optimum's plan;
* the small U-Net: ``path``'s plans for targets from the planner's floor up.

Then what the heap holds where it holds most, buffer by buffer, named by the JAX
primitive that defined each (``op_name``), beside what the model holds at its
peak: the transformer at 50% and the U-Net at 30%, as written and ``path``'s plan
at the search's first target; and for the programs as written, each buffer mapped
back to the graph value it holds (each equation lowered under its own name).

Run from the repository root: ``python -m bench.bench_heap``. Writes
``bench/results/heap.md`` and ``bench/results/heap_peak.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import tempfile

import jax

from bench import models
from bench.output import result_file
from remat._jax.call import CallSpec
from remat._jax.planner import Planner
from remat._jax.program import trace_program
from remat._jax.xla_fusion import tag_equations
from remat.core.options import resolve_options

#: The U-Net's targets above its floor, as a fraction of its temporaries apart.
_TARGET_STEP = 0.0025

_VALUE = re.compile(r"value: <\d+ (\S+?)(\{[^}]*\})?(?: \(phi\))? @0> "
                    r"\(size=(\d+),offset=(\d+)\)")
_RANGE = re.compile(r"^\s+(\S+?)(\{[^}]*\}):(\d+)-(\d+)$", re.M)
_OP_NAME = re.compile(r'^\s*(?:ROOT )?%?(\S+) = .*?op_name="([^"]*)"', re.M)
_EQN = re.compile(r"remat_eqn(\d+)")
_STEP = re.compile(r"^\s+(\d+):(\S+)$", re.M)


@dataclasses.dataclass(frozen=True)
class Heap:
    """XLA's temp heap of one compiled program.

    Attributes:
      temp_bytes: the heap's size (``memory_analysis().temp_size_in_bytes``).
      live_bytes: the most bytes its buffers hold at any one point of the schedule.
    """

    temp_bytes: int
    live_bytes: int

    @property
    def holes(self) -> int:
        return self.temp_bytes - self.live_bytes


def read_heap(buffer_assignment: str, live_ranges: str) -> Heap:
    """The temp heap from XLA's dump of one module: its
    ``*-buffer-assignment.txt`` and ``*-live-range.txt`` texts.

    Bytes held at a point are the union of the offsets its live buffers occupy
    (a buffer reused in place by the next op is counted once).

    >>> assignment = '''allocation 0: size 96, preallocated-temp:
    ...  value: <1 a @0> (size=32,offset=0): f32[8]
    ...  value: <2 b @0> (size=32,offset=64): f32[8]
    ...  value: <3 c @0> (size=32,offset=0): f32[8]
    ... '''
    >>> ranges = 'BufferLiveRange:\\n  a{}:0-1\\n  b{}:1-2\\n  c{}:2-3\\n'
    >>> read_heap(assignment, ranges)
    Heap(temp_bytes=96, live_bytes=64)
    """
    temp, spans = _spans(buffer_assignment, live_ranges)
    return Heap(temp, _most_held(spans)[0])


def _spans(buffer_assignment: str, live_ranges: str) -> tuple[int, list[tuple]]:
    """The temp heap's size, and each of its buffers as (first step, last step,
    offset, end offset, instruction name) in XLA's schedule."""
    temp, spans = 0, []
    ranges = {(m[1], m[2]): (int(m[3]), int(m[4]))
              for m in _RANGE.finditer(live_ranges.split("BufferLiveRange:")[-1])}
    for block in re.split(r"(?m)^allocation ", buffer_assignment):
        head = block.split("\n", 1)[0]
        if "preallocated-temp" not in head:
            continue
        temp = int(re.search(r"size (\d+)", head)[1])
        for m in _VALUE.finditer(block):
            start, end = ranges.get((m[1], m[2] or "{}"), (None, None))
            if start is not None:
                offset = int(m[4])
                spans.append((start, end, offset, offset + int(m[3]), m[1]))
    return temp, spans


def _most_held(spans: list[tuple]) -> tuple[int, int]:
    """The most bytes the buffers hold at one step (the union of their offsets),
    and the first step where they do (-1 without buffers)."""
    most, where = 0, -1
    for t in range(max((end for _, end, *_ in spans), default=-1) + 1):
        held, top = 0, -1
        for lo, hi in sorted((lo, hi) for s, e, lo, hi, _ in spans if s <= t <= e):
            held += max(hi - max(lo, top), 0)
            top = max(top, hi)
        if held > most:
            most, where = held, t
    return most, where


def held_at_peak(buffer_assignment: str, live_ranges: str, hlo_text: str
                 ) -> dict[tuple[str, int], list[int]]:
    """What XLA's temp heap holds where it holds most: ``{(op, bytes): [buffers,
    bytes]}``, ``op`` the JAX primitive that defined each buffer (the last part
    of its instruction's ``op_name``, as the optimized HLO text gives it), or
    for an instruction XLA added (no ``op_name``: a copy), its name's stem.

    >>> assignment = '''allocation 0: size 96, preallocated-temp:
    ...  value: <1 a @0> (size=32,offset=0): f32[8]
    ...  value: <2 b @0> (size=32,offset=64): f32[8]
    ... '''
    >>> hlo = '%a = f32[8]{0} exp(%x), metadata={op_name="jit(f)/jvp()/exp"}\\n'
    >>> held_at_peak(assignment, 'BufferLiveRange:\\n  a{}:0-1\\n  b{}:1-2\\n', hlo)
    {('exp', 32): [1, 32], ("XLA's b", 32): [1, 32]}
    """
    _, spans = _spans(buffer_assignment, live_ranges)
    _, step = _most_held(spans)
    ops = {m[1]: m[2].rsplit("/", 1)[-1] for m in _OP_NAME.finditer(hlo_text)}
    held: dict[tuple[str, int], list[int]] = {}
    for start, end, lo, hi, name in spans:
        if start <= step <= end:
            _tally(held, ops.get(name) or "XLA's " + re.sub(r"[.\d]+$", "", name),
                   hi - lo)
    return held


def _tally(held: dict, op: str, nbytes: int) -> None:
    """Counts one buffer of ``nbytes`` defined by ``op`` into ``held``."""
    row = held.setdefault((op, nbytes), [0, 0])
    row[0] += 1
    row[1] += nbytes


def heap_of(lowered) -> Heap:
    """Compiles ``lowered`` (a ``jax.stages.Lowered``) with XLA's dump on and reads
    its temp heap (:func:`read_heap`)."""
    assignment, ranges, _ = dumped(lowered)
    return read_heap(assignment, ranges)


def dumped(lowered) -> tuple[str, str, str]:
    """Compiles ``lowered`` with XLA's dump on: its buffer assignment, live
    ranges and optimized HLO, as text."""
    with tempfile.TemporaryDirectory() as out:
        lowered.compile(compiler_options={"xla_dump_to": out})
        [assignment] = pathlib.Path(out).glob("*-buffer-assignment.txt")
        ranges, hlo = (assignment.with_name(assignment.name.replace(
            "-buffer-assignment.txt", tail)) for tail in ("-live-range.txt", ".txt"))
        return assignment.read_text(), ranges.read_text(), hlo.read_text()


def model_held_at_peak(result) -> dict[tuple[str, int], list[int]]:
    """What the planner's model holds at its peak besides the program's inputs
    and outputs (XLA's temp heap holds neither), as :func:`held_at_peak` gives
    XLA's: ``{(op, bytes): [values, bytes]}`` (``result``: a ``PlanResult``)."""
    graph, timeline = result.rewritten.graph, result.timeline
    defined_by = {v: op.label for op in graph.ops for v in op.outputs}
    outside = set(graph.inputs) | set(graph.outputs)
    held: dict[tuple[str, int], list[int]] = {}
    for v in timeline.live_values_at(graph, timeline.peak_step):
        if v not in outside:
            _tally(held, defined_by[v], graph.values[v].nbytes)
    return held


def grounded_rows(name: str, texts: tuple[str, str, str], graph, timeline,
                  top: int = 4) -> list[str]:
    """Table rows: the graph values XLA's temp heap holds where it holds most
    (``texts``: :func:`dumped` of the program ``tag_equations`` tagged), beside those
    the model holds (inputs and outputs aside) at the op XLA runs there: held by
    both, by XLA only, by the model only (the ``top`` largest kinds of each).
    A buffer whose equation has no output of its size (a fusion's other output),
    a second buffer of one value (a broadcast made again) and a buffer of an
    instruction XLA added count as XLA's only."""
    assignment, ranges, hlo = texts
    _, spans = _spans(assignment, ranges)
    _, step = _most_held(spans)
    equation = {}           # instruction -> the innermost equation its op_name names
    for m in _OP_NAME.finditer(hlo):
        if found := _EQN.findall(m[2]):
            equation[m[1]] = int(found[-1])
    sequence = {int(m[1]): m[2] for m in _STEP.finditer(
        ranges.split("BufferLiveRange:")[0])}
    xla: dict = {}          # a graph value, or (label, instruction) for the rest
    for start, end, lo, hi, inst in spans:
        if start <= step <= end:
            op = equation.get(inst)
            if op is None:      # an instruction XLA added (a copy)
                key = ("XLA's " + re.sub(r"[.\d]+$", "", inst), inst)
            else:
                key = next((v for v in graph.ops[op].outputs
                            if graph.values[v].nbytes == hi - lo), None)
                if key is None or key in xla:   # another output, or a second buffer
                    key = (graph.ops[op].label + ("'s other output" if key is None
                                                  else " again"), inst)
            xla[key] = hi - lo
    at = equation.get(sequence.get(step))
    outside = set(graph.inputs) | set(graph.outputs)
    model = {v: graph.values[v].nbytes
             for v in timeline.live_values_at(graph, timeline.schedule.index(at))
             if v not in outside} if at is not None else {}
    mib = 2 ** 20

    def label(key):
        return key[0] if isinstance(key, tuple) else \
            graph.ops[graph.values[key].producer].label

    def kinds(keys, sizes):
        by: dict = {}
        for k in keys:
            _tally(by, label(k), sizes[k])
        rows = sorted(by.items(), key=lambda kv: -kv[1][1])[:top]
        return ", ".join(f"{op} {n} x {size / 1024:,.0f} KiB" for (op, size), (n, _)
                         in rows)

    both = set(xla) & set(model)
    only_xla, only_model = set(xla) - both, set(model) - both
    where = graph.ops[at].label if at is not None else "?"
    return [f"| {name} | {where} | {len(both)}: {sum(xla[k] for k in both) / mib:,.1f} | "
            f"{sum(xla[k] for k in only_xla) / mib:,.1f}: {kinds(only_xla, xla)} | "
            f"{sum(model[k] for k in only_model) / mib:,.1f}: "
            f"{kinds(only_model, model)} |"]


def composition_rows(name: str, xla: dict, model: dict, top: int = 10) -> list[str]:
    """Table rows comparing what XLA and the model hold at their peaks, by the op
    defining each buffer and its size: the ``top`` largest differences, then
    the rest and the totals."""
    keys = sorted(set(xla) | set(model), key=lambda k: -abs(
        xla.get(k, [0, 0])[1] - model.get(k, [0, 0])[1]))
    mib = 2 ** 20

    def row(label, x, m):
        return (f"| {name} | {label} | {x[0]} | {x[1] / mib:,.1f} | {m[0]} | "
                f"{m[1] / mib:,.1f} | {(x[1] - m[1]) / mib:+,.1f} |")

    def total(keys_, table):
        return [sum(table.get(k, [0, 0])[i] for k in keys_) for i in (0, 1)]

    lines = [row(f"{op} ({size / 1024:,.0f} KiB)", xla.get((op, size), [0, 0]),
                 model.get((op, size), [0, 0])) for op, size in keys[:top]]
    lines.append(row("the rest", total(keys[top:], xla), total(keys[top:], model)))
    lines.append(row("**total**", total(keys, xla), total(keys, model)))
    return lines


def _planner(model, algorithm: str, fraction: float) -> tuple[Planner, int]:
    """The automatic pass's planner for ``model``'s gradient (to plan single
    targets), and the limit of ``fraction`` in bytes."""
    args = (model.params, model.batch)
    program, _ = trace_program(jax.grad(model.loss_fn), args, {}, CallSpec(), {})
    options = resolve_options({"memory_limit": fraction, "algorithm": algorithm,
                               "small_node_limit": 0}, {})
    planner = Planner(program, options)
    planner._decide_reading_late()      # as the search does for a limit below plain
    return planner, planner.baseline.limit_bytes(fraction)


def rows(name: str, model, algorithm: str, targets, plans: int) -> list[str]:
    """Table rows for the first ``plans`` distinct plans of ``targets(planner,
    column, limit)`` (model bytes) on the first order."""
    planner, limit = _planner(model, algorithm, 0.3)
    column = planner.frontier.columns[0]
    lines, seen = [], set()
    for target in targets(planner, column, limit):
        cand = column.plan(target)
        if cand.key in seen:
            continue
        if len(seen) == plans:
            break
        seen.add(cand.key)
        m = planner._measure(cand).payload
        heap = heap_of(planner.program.lower(m.jaxpr))
        fixed = m.footprint.total - m.footprint.temp
        met = m.footprint.total <= limit
        kib = 1024
        lines.append(
            f"| {name} | {algorithm} | {target / kib:,.0f} | "
            f"{m.result.timeline.peak_bytes / kib:,.0f} | {len(m.result.regions)} | "
            f"{m.footprint.total / kib:,.0f} / {limit / kib:,.0f} | "
            f"{'yes' if met else 'no'} | {heap.temp_bytes / kib:,.0f} | "
            f"{heap.live_bytes / kib:,.0f} | {heap.holes / kib:,.0f} | "
            f"{'yes' if fixed + heap.live_bytes <= limit else 'no'} |")
        print(lines[-1], flush=True)
    return lines


HEADER = ("| program | algorithm | target (model, KiB) | model peak (KiB) | regions | "
          "XLA footprint / limit (KiB) | met | XLA temp heap (KiB) | held at once "
          "(KiB) | holes (KiB) | would meet without holes |\n"
          "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|")


PEAK_HEADER = ("| program | defined by (buffer size) | XLA buffers | XLA MiB | model values "
               "| model MiB | XLA - model (MiB) |\n|---|---|---:|---:|---:|---:|---:|")


GROUNDED_HEADER = ("| program | op at XLA's peak | values both hold: MiB | XLA only: MiB "
                   "| model only: MiB |\n|---|---|---|---|---|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--unet_plans", type=int, default=10,
                        help="targets from the U-Net's floor up, 0.25%% of its "
                             "temporaries apart")
    args = parser.parse_args()

    def chain_targets(planner, column, limit):
        # the limit in the model's units, as the search's first plan aims
        return [column.estimate(limit)]

    def unet_targets(planner, column, limit):
        timeline = planner.orders[0].timeline
        floor = column.plan(0).model_peak
        temps = timeline.peak_bytes - timeline.input_bytes - timeline.output_bytes
        step = max(int(_TARGET_STEP * temps), 1)
        return [floor + k * step for k in range(8 * args.unet_plans)]

    lines = rows("mlp_chain (12 layers)", models.mlp_chain(layers=12), "optimal",
                 chain_targets, 1)
    lines += rows("unet (3 levels, 32x32, 8 ch)",
                  models.unet(levels=3, batch=4, size=32, base_channels=8), "path",
                  unet_targets, args.unet_plans)
    header = (f"Device: {jax.devices()[0].platform}, jax {jax.__version__}; limits: "
              "30% of the plain program's temporaries; small_node_limit=0; one "
              "plan per target (the first order), distinct plans only.\n\n")
    result_file("heap").write_text("# XLA's temp heap\n\n" + header + HEADER + "\n" +
                                   "\n".join(lines) + "\n")

    # What XLA and the model hold at their peaks: as written, and path's plan at
    # the search's start (the estimate of the limit)
    lines, grounded = [], []
    for name, model, fraction in (("transformer", models.transformer(), 0.5),
                                  ("unet", models.unet(levels=3, batch=4, size=32,
                                                       base_channels=8), 0.3)):
        planner, limit = _planner(model, "path", fraction)
        column = planner.frontier.columns[0]
        start = column.rungs[planner.frontier.start(0, limit)]
        plan = planner._measure(column.plan(start)).payload
        for label, measured in ((f"{name} as written", planner.frontier.plain.payload),
                                (f"{name}, path at {fraction:.0%}", plan)):
            assignment, ranges, hlo = dumped(planner.program.lower(measured.jaxpr))
            lines += composition_rows(label, held_at_peak(assignment, ranges, hlo),
                                      model_held_at_peak(measured.result))
            print("\n".join(lines[-3:]), flush=True)
        # the program as written, each buffer mapped back to its graph value
        program = planner.program
        texts = dumped(program.lower(tag_equations(program.flat)))
        grounded += grounded_rows(name, texts, program.graph, planner.orders[0].timeline)
        print(grounded[-1], flush=True)
    result_file("heap_peak").write_text(
        "# What XLA and the model hold at their peaks\n\n"
        f"Device: {jax.devices()[0].platform}, jax {jax.__version__}; XLA: its temp "
        "heap's buffers at the step of its schedule where they hold most, by the "
        "JAX primitive that defined each (its `op_name`); model: the values live at "
        "its peak, inputs and outputs left out; small_node_limit=0.\n\n"
        + PEAK_HEADER + "\n" + "\n".join(lines) + "\n\n"
        "## As written, by graph value\n\n"
        "Each equation lowered under its own name (`remat_eqnN`), so each XLA "
        "buffer at XLA's peak maps to the graph value it holds; the model's live "
        "values are taken at the op XLA runs there. MiB, and the largest kinds as "
        "defining op, count x size.\n\n" + GROUNDED_HEADER + "\n" +
        "\n".join(grounded) + "\n")


if __name__ == "__main__":
    main()

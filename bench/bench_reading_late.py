"""Benchmark: the plain program with its backward convolutions reading late.

For each program, the plain gradient step and the same step rewritten by
``remat._jax.pins.pin_late_reads`` (each convolution of the backward pass reads
its saved operand gated on its cotangent, so that XLA lays it out where it is
read, not as soon as it exists):

- **footprint**: XLA's figure of each (``memory_analysis()``, in MiB);
- **step time**: the median of ``--rounds`` rounds, each the median of 10 runs
  of each program in turn (interleaved, so that both see the same machine).

The planner uses the rewrite where XLA reads the plain program lower with it
(``Planner._decide_reading_late``); the ``used`` column says whether it would.

Programs: the random programs of seeds ``0 .. N-1`` (``--seeds``) and the
third-party steps of ``bench_third_party``.

Run from the repository root: ``python -m bench.bench_reading_late [--seeds N]``.
Writes ``bench/results/reading_late.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

from bench.bench_third_party import PROGRAMS
from bench.output import result_file
from bench.random_programs import random_program
from remat._jax.call import CallSpec
from remat._jax.compat import core
from remat._jax.pins import pin_late_reads
from remat._jax.program import trace_program
from remat._jax.xla_figures import XlaFootprint

MiB = 2**20


def _median_seconds(compiled, args, runs: int = 10) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def row(name: str, fun, args, rounds: int) -> str:
    """One table row: footprints and step times, plain and reading late."""
    program, _ = trace_program(fun, args, {}, CallSpec(), {})
    flat = program.flat
    late = core.ClosedJaxpr(pin_late_reads(flat.jaxpr), flat.consts)
    pins = sum(e.primitive.name == "remat" for e in late.jaxpr.eqns)
    plain_c, late_c = program.compile(flat), program.compile(late)
    plain_fp = XlaFootprint.of(plain_c).total
    late_fp = XlaFootprint.of(late_c).total
    leaves = jax.tree.leaves(args)
    jax.block_until_ready(plain_c(*leaves))
    jax.block_until_ready(late_c(*leaves))
    plain_t, late_t = [], []
    for _ in range(rounds):
        plain_t.append(_median_seconds(plain_c, leaves))
        late_t.append(_median_seconds(late_c, leaves))
    a, b = statistics.median(plain_t), statistics.median(late_t)
    return (f"| {name} | {pins} | {plain_fp / MiB:.2f} | {late_fp / MiB:.2f} | "
            f"{late_fp / plain_fp:.2f} | {'yes' if late_fp < plain_fp else 'no'} | "
            f"{a * 1e3:.1f} | {b * 1e3:.1f} | {b / a:.2f} |")


HEADER = ("| program | late reads | plain MiB | reading late MiB | ratio | used | "
          "plain ms | reading late ms | time ratio |\n"
          "|---|---:|---:|---:|---:|---|---:|---:|---:|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(HEADER, flush=True)
    rows = []
    cases = [(f"rp{s}", lambda s=s: random_program(s)) for s in range(args.seeds)]
    for name, make in cases:
        p = make()
        rows.append(row(f"{name} ({p.family})", p.step, (p.params, p.inputs), args.rounds))
        print(rows[-1], flush=True)
    for name, make in PROGRAMS.items():
        fun, fargs, *_ = make()
        rows.append(row(name, fun, fargs, args.rounds))
        print(rows[-1], flush=True)
    result_file("reading_late").write_text(
        "# Backward convolutions reading late\n\n`python -m bench.bench_reading_late "
        f"--seeds {args.seeds}` ({jax.default_backend()}, jax {jax.__version__}).\n\n"
        + HEADER + "\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()

"""Benchmark: does the planner's memory model agree with XLA on the plans it makes?

The search plans in the model's bytes and measures in XLA's. It converts one into
the other by the plain program's ratio (XLA's footprint over the model's peak),
so what matters is whether that ratio holds for the plans: for every plan the
search compiled while answering 80%, 50% and 30% of a program's temporaries,

    error = |(XLA footprint / model peak) / (the same ratio of the plain program) - 1|

(0: the model ranks and sizes the plan exactly as XLA does, after one scale).
The plain program's own ratio is shown too. Programs: the first ``--seeds``
random programs of ``bench/random_programs.py`` and the MLP chain and U-Net of
``bench/models.py``.

A change to the model (fusion, buffer reuse, schedules) is judged here first:
a lower median error over the same programs is a model closer to XLA.

Run from the repository root: ``python -m bench.bench_agreement [--seeds 16]``.
Writes ``bench/results/agreement.md``.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from bench import models
from bench.output import result_file
from bench.random_programs import random_program
from remat._jax.call import CallSpec
from remat._jax.planner import Planner
from remat._jax.program import trace_program
from remat.core.options import resolve_options

FRACTIONS = (0.8, 0.5, 0.3)


def plan_errors(step, args) -> tuple[float, list[float]]:
    """The plain program's XLA-over-model ratio, and the error (module docstring)
    of every plan the search compiled answering :data:`FRACTIONS`."""
    program, _ = trace_program(step, args, {}, CallSpec(), {})
    planner = Planner(program, resolve_options({"memory_limit": FRACTIONS[0]}, {}))
    for fraction in FRACTIONS:
        planner.answer(planner.baseline.limit_bytes(fraction))
    plain = planner.plain.total / planner.orders[0].timeline.peak_bytes
    errors = []
    for point in planner.frontier.points.values():
        result = getattr(point.payload, "result", None)
        if result is not None and result.regions:
            ratio = point.footprint / result.timeline.peak_bytes
            errors.append(abs(ratio / plain - 1))
    return plain, errors


def programs(seeds: int):
    """(name, step, args) of each program measured."""
    for seed in range(seeds):
        p = random_program(seed)
        yield p.name, p.step, (p.params, p.inputs)
    for name in ("mlp_chain", "unet"):
        m = getattr(models, name)()
        yield name, jax.grad(m.loss_fn), (m.params, m.batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=16)
    args = parser.parse_args()
    lines, every = [], []
    for name, step, inputs in programs(args.seeds):
        plain, errors = plan_errors(step, inputs)
        every += errors
        cells = (f"{np.median(errors):.3f} | {np.max(errors):.3f}" if errors else "- | -")
        lines.append(f"| {name} | {plain:.3f} | {len(errors)} | {cells} |")
        print(lines[-1], flush=True)
    summary = (f"**{len(every)} plans: error median {np.median(every):.3f}, mean "
               f"{np.mean(every):.3f}, 90th percentile {np.percentile(every, 90):.3f}**")
    print(summary)
    result_file("agreement").write_text(
        f"`python -m bench.bench_agreement --seeds {args.seeds}` ({jax.default_backend()}, "
        f"jax {jax.__version__}).\n\n{summary}\n\n"
        "| program | plain: XLA / model | plans | median error | max error |\n"
        "|---|---:|---:|---:|---:|\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""How well does ``remat.analyze`` predict XLA's memory, and how fast is it?

For the training gradient (``jax.value_and_grad`` of the loss w.r.t. the params) of
each model in ``bench/models.py``, plus a 20,000-equation chain of small ops, prints
a markdown table and writes it to ``bench/results/analyze.md``:

* predicted footprint (``remat.analyze(...).peak_bytes``) against XLA's compiled
  footprint ``argument + output + temp - alias`` bytes of
  ``jax.jit(step).lower(...).compile().memory_analysis()`` (XLA:CPU here);
* the time ``analyze`` takes (tracing included, first call, nothing cached) against
  the time XLA takes to lower and compile the same program.

Run from the repository root::

    python bench/bench_analyze.py              # every program
    python bench/bench_analyze.py mlp_chain    # some of them
"""

from __future__ import annotations

import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import remat  # noqa: E402
from bench.models import ALL_MODELS, Model  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "analyze.md")
MIB = 1024.0 * 1024.0


def long_chain(equations: int = 20_000) -> tuple[str, object, tuple]:
    """A forward program of ``equations`` small elementwise ops (sin, mul, ...)."""

    def chain(x):
        for _ in range(equations // 2):
            x = lax.sin(x) * 1.01
        return x

    return f"chain_{equations // 1000}k_ops", chain, (jnp.ones((512, 512), jnp.float32),)


def xla_footprint(fun, args) -> tuple[int, float]:
    """``(argument + output + temp - alias bytes, lower+compile seconds)``."""
    start = time.perf_counter()
    compiled = jax.jit(fun).lower(*args).compile()
    seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    footprint = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                 - m.alias_size_in_bytes)
    return footprint, seconds


def measure(name: str, fun, args, compile_xla: bool = True) -> dict:
    start = time.perf_counter()
    report = remat.analyze(fun, *args)
    analyze_s = time.perf_counter() - start
    row = {"program": name, "ops": len(report.graph.ops), "predicted": report.peak_bytes,
           "analyze_s": analyze_s, "xla": None, "compile_s": None}
    if compile_xla:
        row["xla"], row["compile_s"] = xla_footprint(fun, args)
    return row


def format_table(rows: list[dict]) -> str:
    lines = [
        "| program | graph ops | predicted MiB | XLA MiB | predicted / XLA | analyze s "
        "| XLA compile s | analyze / compile |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        xla = f"{r['xla'] / MIB:.1f}" if r["xla"] else "-"
        ratio = f"{r['predicted'] / r['xla']:.3f}" if r["xla"] else "-"
        comp = f"{r['compile_s']:.2f}" if r["compile_s"] else "-"
        speed = f"{r['analyze_s'] / r['compile_s']:.3f}" if r["compile_s"] else "-"
        lines.append(f"| {r['program']} | {r['ops']} | {r['predicted'] / MIB:.1f} | {xla} "
                     f"| {ratio} | {r['analyze_s']:.2f} | {comp} | {speed} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    chain_name, chain_fun, chain_args = long_chain()
    wanted = argv or [*ALL_MODELS, chain_name]
    rows = []
    for name in wanted:
        if name == chain_name:
            rows.append(measure(name, chain_fun, chain_args))
        elif name in ALL_MODELS:
            model: Model = ALL_MODELS[name]()
            rows.append(measure(name, model.step, (model.params, model.batch)))
        else:
            raise SystemExit(f"unknown program {name!r}; choose from "
                             f"{[*ALL_MODELS, chain_name]}.")
        print(f"measured {name}", file=sys.stderr, flush=True)
    table = format_table(rows)
    header = (f"jax {jax.__version__}, backend {jax.default_backend()}, "
              f"{os.cpu_count()} CPUs, {platform.machine()}; footprint = argument + output"
              " + temp - alias bytes; times are one cold call each.\n\n")
    print(table)
    if not argv:
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w") as f:
            f.write("# remat.analyze vs XLA (bench/bench_analyze.py)\n\n" + header + table + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

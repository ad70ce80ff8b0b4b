"""Benchmark: no remat vs ``jax.checkpoint`` vs ``remat.checkpoint``, as XLA sees them.

For each model, the gradient step ``jax.jit(jax.grad(loss))`` is compiled three
times (no checkpoint, each unit under ``jax.checkpoint``, each unit under
``remat.checkpoint``) and we report XLA's own figures: temp bytes and footprint
(argument + output + temp - alias) from ``memory_analysis()``, FLOPs from
``cost_analysis()``, and the median step time, the variants timed in turn so that
the machine's noise hits them alike. Gradients are checked against no remat.

Run from the repository root: ``python -m bench.bench_checkpoint``
(``--quick`` for fewer timing rounds). Writes ``bench/results/checkpoint.md``.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import remat
from bench import models
from bench.output import result_file

VARIANTS = {
    "no remat": lambda f: f,
    "jax.checkpoint": jax.checkpoint,
    "remat.checkpoint": remat.checkpoint,
}

MODELS = {
    "24-layer tanh chain (6 segments of 4)": models.mlp_chain,
    "8-block transformer (each block)": models.transformer,
}


def footprint(compiled) -> tuple[int, int]:
    """``(temp bytes, footprint bytes)`` from XLA's memory analysis."""
    m = compiled.memory_analysis()
    total = (m.argument_size_in_bytes + m.output_size_in_bytes +
             m.temp_size_in_bytes - m.alias_size_in_bytes)
    return m.temp_size_in_bytes, total


def compare(make_model, rounds: int = 5) -> list[dict]:
    """Compiles and times every variant of one model; returns one row per variant."""
    rows, compiled = [], {}
    for name, wrap in VARIANTS.items():
        model = make_model(wrap=wrap)
        params, batch = model.params, model.batch
        fn = jax.jit(jax.grad(model.loss_fn)).lower(params, batch).compile()
        temp, total = footprint(fn)
        grads = jax.block_until_ready(fn(params, batch))
        compiled[name] = (fn, params, batch)
        rows.append(dict(variant=name, temp=temp, footprint=total,
                         flops=fn.cost_analysis()["flops"], grads=grads, times=[]))
    for _ in range(rounds):          # interleaved: one step of each variant per round
        for row in rows:
            fn, params, batch = compiled[row["variant"]]
            start = time.perf_counter()
            jax.block_until_ready(fn(params, batch))
            row["times"].append(time.perf_counter() - start)
    reference = jax.tree_util.tree_leaves(rows[0]["grads"])
    for row in rows:
        row["max_grad_err"] = max(float(np.max(np.abs(a - b))) for a, b in
                                  zip(reference, jax.tree_util.tree_leaves(row["grads"])))
        row["time"] = float(np.median(row["times"]))
    return rows


def table(results: dict[str, list[dict]]) -> str:
    """Markdown table; ratios are against "no remat" of the same model."""
    lines = ["| model | variant | XLA temp (MiB) | temp ratio | footprint (MiB) | "
             "XLA GFLOPs | FLOPs ratio | median step (s) | time ratio | max grad err |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for model, rows in results.items():
        base = rows[0]
        for r in rows:
            lines.append(
                f"| {model} | {r['variant']} | {r['temp'] / 2**20:.1f} | "
                f"{r['temp'] / base['temp']:.2f} | {r['footprint'] / 2**20:.1f} | "
                f"{r['flops'] / 1e9:.1f} | {r['flops'] / base['flops']:.2f} | "
                f"{r['time']:.3f} | {r['time'] / base['time']:.2f} | "
                f"{r['max_grad_err']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed steps per variant")
    args = parser.parse_args()
    results = {name: compare(make, args.rounds) for name, make in MODELS.items()}
    text = table(results)
    print(text)
    result_file("checkpoint").write_text(
        f"Device: {jax.devices()[0].device_kind} ({jax.default_backend()}), "
        f"jax {jax.__version__}, median of {args.rounds} steps.\n\n{text}\n")


if __name__ == "__main__":
    main()

"""Benchmark: each heuristic's recomputation against the optimum at the same limit.

For programs small enough to solve exactly (a 12-layer chain and a small U-Net,
their training gradients), ``remat.pareto`` plans each algorithm at 50% and 30%
of the plain program's temporaries and reports XLA's own figures: footprint
against the limit, FLOPs (``cost_analysis()``) and the median step time. The
yardstick is ``algorithm="optimal"`` (the integer program of
``remat.core.algorithms.optimal``); each heuristic's extra FLOPs are reported as a
multiple of the optimum's.

Run from the repository root: ``python -m bench.bench_optimal``. Writes
``bench/results/optimal.md`` and a memory/time plot per program,
``bench/results/optimal_0.png``, ``optimal_1.png``.
"""

from __future__ import annotations

import argparse
import pathlib

import jax

import remat
from bench import models

PROGRAMS = {
    "mlp_chain (12 layers)": lambda: models.mlp_chain(layers=12),
    "unet (3 levels, 32x32, 8 ch)": lambda: models.unet(levels=3, batch=4, size=32,
                                                        base_channels=8),
}
ALGORITHMS = ("path", "standard", "optimal")


def run(name: str, limits, rounds: int):
  model = PROGRAMS[name]()
  return remat.pareto(jax.grad(model.loss_fn), model.params, model.batch,
                      limits=limits, algorithms=ALGORITHMS, rounds=rounds,
                      small_node_limit=0)


def comparison(name: str, p: remat.Pareto, limits) -> list[str]:
  lines = []
  for limit in limits:
    rows = {r.algorithm: r for r in p.rows if r.limit == limit}
    opt = rows["optimal"]
    for algorithm in ALGORITHMS:
      r = rows[algorithm]
      if r.error:
        lines.append(f"| {name} | {limit:.0%} | {algorithm} | refused | | | |")
        continue
      ratio = ("-" if opt.error or not opt.extra_flops else
               f"{r.extra_flops / opt.extra_flops:.2f}")
      lines.append(f"| {name} | {limit:.0%} | {algorithm} | "
                   f"{r.footprint_bytes / 2**20:.2f} / {r.limit_bytes / 2**20:.2f} | "
                   f"{r.extra_flops / 1e9:.4f} | {ratio} | "
                   f"{r.step_seconds / p.rows[0].step_seconds:.2f} |")
  return lines


HEADER = ("| program | limit (of temps) | algorithm | XLA footprint / limit (MiB) | "
          "extra GFLOPs (XLA) | extra FLOPs / optimum's | step-time ratio |\n"
          "|---|---:|---|---:|---:|---:|---:|")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--limits", default="0.5,0.3")
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args()
  limits = tuple(float(x) for x in args.limits.split(","))
  out = pathlib.Path(__file__).parent / "results"
  out.mkdir(exist_ok=True)
  lines, details = [], []
  import matplotlib
  matplotlib.use("Agg")
  for k, name in enumerate(PROGRAMS):
    p = run(name, limits, args.rounds)
    lines += comparison(name, p, limits)
    details.append(f"### {name}\n\n{p.to_markdown()}")
    p.plot(out / f"optimal_{k}.png", title=name)
    print("\n".join(lines[-len(limits) * len(ALGORITHMS):]), flush=True)
  text = (f"Device: {jax.default_backend()}, jax {jax.__version__}; XLA's figures; "
          f"median of {args.rounds} steps, variants timed in turn; "
          "small_node_limit=0.\n\n" + HEADER + "\n" + "\n".join(lines) +
          "\n\n" + "\n".join(details))
  (out / "optimal.md").write_text(text)
  print(text)


if __name__ == "__main__":
  main()

"""Benchmark: each heuristic's recomputation against the optimum at the same limit.

For programs small enough to solve exactly (a 12-layer chain and a small U-Net,
their training gradients), two tables:

* *planner*: on the planning graph, each algorithm at 50% and 30% of the
  temporaries the simulator predicts; the simulated peak of the rewritten
  program against the limit, and the extra FLOPs of the recomputation (our op
  model), as a multiple of ``"optimal"``'s.
* *XLA*: ``remat.pareto`` plans, compiles and times each algorithm at 75%, 65%, 50%
  and 30% of XLA's temporaries: XLA's footprint against the limit, XLA's extra
  FLOPs (``cost_analysis()``) as a multiple of the optimum's, the median step
  time (variants timed in turn) as a ratio to the plain program.

The yardstick is ``algorithm="optimal"`` (the integer program of
``remat.core.algorithms.optimal``).

Run from the repository root: ``python -m bench.bench_optimal``. Writes
``bench/results/optimal.md`` and a memory/time plot per program,
``bench/results/optimal_0.png``, ``optimal_1.png``.
"""

from __future__ import annotations

import argparse

import time

import jax

import remat
from bench import models
from bench.output import result_file
from remat._jax.call import CallSpec
from remat._jax.program import trace_program
from remat.core.algorithms import get_algorithm
from remat.core.options import RematOptions
from remat.core.scheduled import on_schedule
from remat.core.schedulers import get_scheduler

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


def planner_rows(name: str, limits) -> list[str]:
    """The algorithms on the planning graph, at fractions of the predicted temps."""
    model = PROGRAMS[name]()
    program, _ = trace_program(jax.grad(model.loss_fn), (model.params, model.batch), {},
                               CallSpec(), {})
    graph = program.graph
    # one Scheduled for every limit and algorithm: what one plan works out of
    # the order serves the next, as in the planner
    scheduled = on_schedule(graph, get_scheduler("best")(graph))
    base = scheduled.timeline
    fixed = base.input_bytes + base.output_bytes
    lines = []
    for fraction in limits:
        limit = fixed + int(fraction * (base.peak_bytes - fixed))
        results = {}
        for algorithm in ALGORITHMS:
            start = time.perf_counter()
            results[algorithm] = get_algorithm(algorithm)(
                scheduled, RematOptions(limit, algorithm, small_node_bytes=0))
            results[algorithm] = (results[algorithm], time.perf_counter() - start)
        opt = results["optimal"][0]
        for algorithm in ALGORITHMS:
            r, seconds = results[algorithm]
            ratio = (f"{r.extra_flops / opt.extra_flops:.2f}"
                     if opt.met and r.met and opt.extra_flops else "-")
            gap = f", gap {opt.gap:.1%}" if opt.gap is not None else ""
            status = f" ({opt.status}{gap})" if algorithm == "optimal" else ""
            lines.append(f"| {name} | {graph.num_ops} | {fraction:.0%} | {algorithm}{status} | "
                         f"{r.timeline.peak_bytes / 2**20:.2f} / {limit / 2**20:.2f} | "
                         f"{'yes' if r.met else 'NO'} | {r.extra_flops / 1e6:.2f} | {ratio} | "
                         f"{seconds:.2f} |")
        print("\n".join(lines[-len(ALGORITHMS):]), flush=True)
    return lines


PLANNER_HEADER = (
    "| program | ops | limit (of predicted temps) | algorithm | simulated peak / limit "
    "(MiB) | met | extra MFLOPs (op model) | extra FLOPs / optimum's | plan (s) |\n"
    "|---|---:|---:|---|---:|---|---:|---:|---:|")


def comparison(name: str, p: remat.Pareto, limits) -> list[str]:
    lines = []
    for limit in limits:
        rows = {r.algorithm: r for r in p.rows if r.limit == limit}
        opt = rows["optimal"]
        # no yardstick where XLA read every plan of the optimal search over the limit
        # and the plan is a heuristic's own search's
        yardstick = not opt.error and opt.extra_flops and opt.status != "heuristic_search"
        for algorithm in ALGORITHMS:
            r = rows[algorithm]
            label = (f"{algorithm} ({r.status})" if r.status == "heuristic_search"
                     else algorithm)
            if r.error:
                lines.append(f"| {name} | {limit:.0%} | {label} | refused | | | |")
                continue
            ratio = f"{r.extra_flops / opt.extra_flops:.2f}" if yardstick else "-"
            lines.append(f"| {name} | {limit:.0%} | {label} | "
                         f"{r.footprint_bytes / 2**20:.2f} / {r.limit_bytes / 2**20:.2f} | "
                         f"{r.extra_flops / 1e6:.2f} | {ratio} | "
                         f"{r.step_seconds / p.rows[0].step_seconds:.2f} |")
    return lines


HEADER = ("| program | limit (of temps) | algorithm | XLA footprint / limit (MiB) | "
          "extra MFLOPs (XLA) | extra FLOPs / optimum's | step-time ratio |\n"
          "|---|---:|---|---:|---:|---:|---:|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="0.75,0.65,0.5,0.3")
    parser.add_argument("--planner_limits", default="0.5,0.3")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    limits = tuple(float(x) for x in args.limits.split(","))
    lines, details, planner = [], [], []
    for name in PROGRAMS:
        planner += planner_rows(name, [float(x) for x in args.planner_limits.split(",")])
    import matplotlib
    matplotlib.use("Agg")
    for k, name in enumerate(PROGRAMS):
        p = run(name, limits, args.rounds)
        lines += comparison(name, p, limits)
        details.append(f"### {name}\n\n{p.to_markdown()}")
        p.plot(result_file(f"optimal_{k}", ".png"), title=name)
        print("\n".join(lines[-len(limits) * len(ALGORITHMS):]), flush=True)
    text = (f"Device: {jax.default_backend()}, jax {jax.__version__}; XLA's figures; "
            f"median of {args.rounds} steps, variants timed in turn; "
            "small_node_limit=0.\n\nPlanner (the simulator's bytes, the op model's "
            "FLOPs):\n\n" + PLANNER_HEADER + "\n" + "\n".join(planner) +
            "\n\nXLA (compiled footprint, cost_analysis FLOPs, measured time):\n\n" +
            HEADER + "\n" + "\n".join(lines) +
            "\n\n" + "\n".join(details))
    result_file("optimal").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

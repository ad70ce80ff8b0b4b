"""Benchmark: automatic rematerialization (``remat.jit``) under memory limits.

For each model's training gradient, each algorithm and each limit (a fraction of
the plain program's temporaries, on top of its arguments and outputs), we plan,
compile and report XLA's own figures: the compiled footprint against the limit,
the FLOPs ratio to the plain program (``cost_analysis()``), the median step-time
ratio (plain and rematerialized steps timed in turn), the planning time (tracing
excluded, as ``jax.jit`` traces too) against XLA's compile time of the plain
program, taken side by side (``--plan-runs`` times, three by default, a compile
then a search; the medians of each and of their ratios), and whether the
gradients match.
A limit that cannot be met is reported with the least footprint reached. One
small program is planned first, untimed, so that one-time initialization (first
calls into JAX's tracing machinery and NumPy) is not charged to the first model.

Run from the repository root: ``python -m bench.bench_auto`` (``--models``,
``--algorithms``, ``--limits`` to choose). Writes ``bench/results/auto.md`` and
``bench/results/auto.png`` (memory vs time, one point per plan).
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax
import numpy as np

import remat
from bench import models
from remat._jax.planner import forget_planners
from bench.output import result_file

MODELS = {
    "mlp_chain": models.mlp_chain,
    "transformer": models.transformer,
    "unet": models.unet,
    "resnet50": models.resnet50,
}


#: The least seconds one timed sample lasts: a step of a millisecond or two (the
#: MLP chain on a GPU) is run several times per sample, or dispatch and timer
#: noise decide the ratio.
_MIN_SAMPLE_SECONDS = 0.05


def _median_times(fns, args, rounds):
    """Median seconds per call of each of ``fns``, timed in turn, after one call
    each (so that no first-run cost is timed)."""
    calls = []
    for fn in fns:
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        once = time.perf_counter() - start
        calls.append(max(1, int(_MIN_SAMPLE_SECONDS / max(once, 1e-6))))
    times = [[] for _ in fns]
    for _ in range(rounds):
        for k, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(calls[k]):
                out = fn(*args)
            jax.block_until_ready(out)
            times[k].append((time.perf_counter() - start) / calls[k])
    return [float(np.median(t)) for t in times]


def _compile_once(step, args):
    """Seconds XLA takes to compile ``jax.jit(step)`` (JAX's caches cleared first,
    since a compile of the same program is otherwise answered from memory), and
    the compiled program."""
    jax.clear_caches()
    lowered = jax.jit(step).lower(*args)
    start = time.perf_counter()
    plain = lowered.compile()
    return time.perf_counter() - start, plain


def jit_first_call(step, args) -> float:
    """Seconds ``jax.jit(step)``'s first call takes before it runs: tracing,
    lowering and compiling, nothing cached (the floor of any first call)."""
    jax.clear_caches()
    start = time.perf_counter()
    jax.jit(step).lower(*args).compile()
    return time.perf_counter() - start


def warm_up() -> None:
    small = models.mlp_chain(layers=2, batch=64, width=32)
    for algorithm in ("path", "standard", "compress"):
        try:
            remat.plan(jax.grad(small.loss_fn), small.params, small.batch,
                       memory_limit=0.5, algorithm=algorithm, small_node_limit=0)
        except remat.MemoryLimitError:
            pass


def _planned(step, args, fraction: float, algorithm: str, runs: int):
    """The plan for one row, and its planning and compile times taken side by
    side: ``runs`` times, a compile of the plain program, then a search (which
    compiles its attempts again: XLA's compiles are not planning). Returns the
    plan, the median planning and compile seconds, and the median of the per-run
    ratios (a slow spell of the machine slows both), and the median ratio of the
    whole first call (tracing, planning and every compile) to the plain compile,
    and to ``jax.jit``'s first call (tracing, lowering, compiling). Each search
    starts afresh (no frontier kept from the run before). Every search must end
    at the same plan; a limit refused is refused at once."""
    plans, compiles, firsts, jits = [], [], [], []
    for _ in range(runs):
        compiles.append(_compile_once(step, args)[0])
        jits.append(jit_first_call(step, args))
        forget_planners()
        jax.clear_caches()
        start = time.perf_counter()
        options = {} if algorithm == "auto" else {"algorithm": algorithm}
        plans.append(remat.plan(step, *args, memory_limit=fraction, **options))
        firsts.append(time.perf_counter() - start)
    if len({(p.planned.total, p.extra_flops) for p in plans}) > 1:
        raise AssertionError(f"{algorithm} at {fraction:.0%}: the searches ended at "
                             "different plans; planning should be deterministic.")
    seconds = [p.plan_seconds for p in plans]
    return (plans[0], float(np.median(seconds)), float(np.median(compiles)),
            float(np.median([s / c for s, c in zip(seconds, compiles)])),
            float(np.median([f / c for f, c in zip(firsts, compiles)])),
            float(np.median([f / j for f, j in zip(firsts, jits)])))


def run_model(name: str, algorithms, limits, rounds: int, plan_runs: int = 3
              ) -> list[dict]:
    model = MODELS[name]()
    step = jax.grad(model.loss_fn)
    args = (model.params, model.batch)
    _, plain = _compile_once(step, args)
    want = jax.tree_util.tree_leaves(plain(*args))
    plain_flops = plain.cost_analysis()["flops"]
    rows = []
    for algorithm in algorithms:
        for fraction in limits:
            row = dict(model=name, algorithm=algorithm, fraction=fraction)
            try:
                plan, plan_s, compile_s, plan_ratio, first_ratio, jit_ratio = _planned(
                    step, args, fraction, algorithm, plan_runs)
            except remat.MemoryLimitError as e:
                row.update(error=str(e), least=e.least_bytes)
                rows.append(row)
                print(_line(row), flush=True)
                continue
            got = jax.tree_util.tree_leaves(plan.compiled(*args))
            err = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-30))
                      for a, b in zip(want, got))
            t_plain, t_plan = _median_times([plain, plan.compiled], args, rounds)
            row.update(limit=plan.limit_bytes, baseline=plan.baseline.total,
                       footprint=plan.planned.total,
                       flops_ratio=plan.compiled.cost_analysis()["flops"] / plain_flops,
                       time_ratio=t_plan / t_plain, plan_s=plan_s, compile_s=compile_s,
                       plan_ratio=plan_ratio, first_ratio=first_ratio, jit_ratio=jit_ratio,
                       rel_err=err,
                       by=plan.algorithm)
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def _line(r: dict) -> str:
    mib = 2 ** 20
    if "error" in r:
        least = f"{r['least'] / mib:.1f} MiB" if r["least"] else "-"
        return (f"| {r['model']} | {r['algorithm']} | {r['fraction']:.0%} | refused: least "
                f"reached {least} | | | | | | | | |")
    return (f"| {r['model']} | {r['algorithm']} | {r['fraction']:.0%} | "
            f"{r['limit'] / mib:.1f} | {r['baseline'] / mib:.1f} -> "
            f"{r['footprint'] / mib:.1f} | {r['flops_ratio']:.2f} | "
            f"{r['time_ratio']:.2f} | {r['plan_s']:.2f} / {r['compile_s']:.2f} | "
            f"{r['plan_ratio']:.2f} | {r['first_ratio']:.2f} | {r['jit_ratio']:.2f} | "
            f"{r['rel_err']:.0e} | "
            f"{r['by']} |")


HEADER = ("| model | algorithm | limit (of temps) | limit (MiB) | XLA footprint (MiB) | "
          "FLOPs ratio | step-time ratio | plan / compile (s) | plan ÷ compile | "
          "first call ÷ compile | first call ÷ jax.jit's | grad rel. err | planned by |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len({r["model"] for r in rows}), figsize=(16, 4),
                             squeeze=False)
    for ax, name in zip(axes[0], dict.fromkeys(r["model"] for r in rows)):
        for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
            pts = [(r["footprint"] / r["baseline"], r["time_ratio"]) for r in rows
                   if r["model"] == name and r["algorithm"] == algorithm and "error" not in r]
            if pts:
                ax.plot(*zip(*sorted(pts)), "o-", label=algorithm)
        ax.set_title(name)
        ax.set_xlabel("XLA footprint / plain")
        ax.set_ylabel("step time / plain")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--algorithms", default="auto,path,standard",
                        help="auto: the default (no algorithm=)")
    parser.add_argument("--limits", default="0.75,0.5,0.3")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plan-runs", type=int, default=3,
                        help="searches per row; the planning time is their median")
    args = parser.parse_args()
    print(HEADER, flush=True)
    warm_up()
    rows = []
    for name in args.models.split(","):
        rows += run_model(name, args.algorithms.split(","),
                          [float(x) for x in args.limits.split(",")], args.rounds,
                          args.plan_runs)
    result_file("auto").write_text(
        f"Device: {jax.default_backend()}, jax {jax.__version__}; median of "
        f"{args.rounds} samples, each at least {_MIN_SAMPLE_SECONDS * 1000:.0f} ms of "
        f"steps; planning and compile times: medians of {args.plan_runs} compiles of the "
        "plain program, each followed by a search; plan ÷ compile: the median of "
        "their ratios.\n\n"
        f"{HEADER}\n" + "\n".join(_line(r) for r in rows) + "\n")
    plot(rows, result_file("auto", ".png"))


if __name__ == "__main__":
    main()

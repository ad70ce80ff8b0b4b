"""remat demo: the automatic pass on a transformer's training step.

Plans an Adam training step (optax) of a small pre-norm transformer to fit in 50%
of its temporary memory, printing one line per planning attempt, then the plan,
then runs a few steps with the plan and with plain ``jax.jit`` and checks that
they train alike. Writes a PNG of the memory timeline before and after and says
where. Run from the repository root: ``python -m examples.demo [--out DIR]``.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import re
import sys
import time

import jax
import jax.numpy as jnp
import optax

import remat
from bench import models

LIMIT = 0.5     # of the step's temporaries (arguments and outputs are kept whole)


class _InMiB(logging.Formatter):
    """Log lines with byte counts (integers of 6 digits or more) shown in MiB."""

    def format(self, record: logging.LogRecord) -> str:
        line = re.sub(r"\b\d{6,}\b", lambda m: f"{int(m.group()) / 2**20:.1f}MiB",
                      record.getMessage())
        return f"  [{record.relativeCreated / 1000:5.1f} s] {line}"


def _show_planning_progress() -> None:
    """Print the automatic pass's log lines (one per planning attempt) as they come."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_InMiB())
    logger = logging.getLogger("remat")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)


def _plot(plan: remat.Plan, path: pathlib.Path) -> None:
    """Live bytes per step of the planner's model, before and after, with the limit."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mib = 2 ** 20
    fig, ax = plt.subplots(figsize=(8, 4))
    for timeline, label in ((plan.result.baseline, "before (as written)"),
                            (plan.result.timeline, "after (rematerialized)")):
        ax.plot([b / mib for b in timeline.live_during_bytes], label=label, lw=1)
    ax.axhline(plan.result.limit_bytes / mib, color="red", ls="--",
               label="planner's target")
    ax.set_xlabel("step of the schedule (one op each)")
    ax.set_ylabel("live bytes (MiB, planner's model)")
    ax.set_title(f"XLA footprint {plan.baseline.total / mib:.1f} -> "
                 f"{plan.planned.total / mib:.1f} MiB (limit {plan.limit_bytes / mib:.1f})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out", help="directory for the PNG")
    out = pathlib.Path(parser.parse_args(argv).out)

    model = models.transformer(blocks=4, batch=4, seq=128, width=128, heads=4)
    optimizer = optax.adam(1e-3)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(model.loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, batch = model.params, model.batch
    opt_state = optimizer.init(params)
    print(f"jax {jax.__version__} on {jax.default_backend()}: an Adam step of a 4-block "
          f"transformer (batch 4, seq 128, width 128), memory_limit={LIMIT} "
          "(half of its temporaries)\n")

    _show_planning_progress()
    print("planning (one line per attempt; XLA compiles each plan to check it):")
    step = remat.jit(train_step, memory_limit=LIMIT)
    start = time.perf_counter()
    plan = step.plan_for(params, opt_state, batch)
    logging.getLogger("remat").setLevel(logging.WARNING)
    print(f"done in {time.perf_counter() - start:.1f} s\n")

    print(plan)
    print(f"recomputed ops ({len(plan.recomputed)}), the first five:")
    for line in plan.recomputed[:5]:
        print("  " + line)

    plain = jax.jit(train_step)
    ours = (params, opt_state)
    theirs = (params, opt_state)
    print("\nthree training steps, plain jax.jit against remat.jit:")
    for i in range(3):
        *ours, loss_ours = step(*ours, batch)
        *theirs, loss_plain = plain(*theirs, batch)
        print(f"  step {i}: loss {float(loss_plain):.6f} (jax.jit)  "
              f"{float(loss_ours):.6f} (remat.jit)")
    worst = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                zip(jax.tree.leaves(ours[0]), jax.tree.leaves(theirs[0])))
    print(f"  largest parameter difference after three steps: {worst:.1e}")

    out.mkdir(parents=True, exist_ok=True)
    picture = out / "demo_memory.png"
    _plot(plan, picture)
    print(f"\nmemory timeline before and after: {picture.resolve()}")


if __name__ == "__main__":
    main()

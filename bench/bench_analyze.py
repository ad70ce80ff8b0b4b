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

    python bench/bench_analyze.py                   # every program
    python bench/bench_analyze.py mlp_chain         # some of them (not saved)
    python bench/bench_analyze.py --compile-chain   # also compile the 20k-op chain
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
from bench.models import ALL_MODELS, Model, mlp_chain, transformer  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "analyze.md")
MIB = 1024.0 * 1024.0


def long_chain(equations: int = 20_000) -> tuple[str, object, tuple]:
    """A forward program of ``equations`` small elementwise ops (sin, cos, ...)."""

    def chain(x):
        for _ in range(equations // 2):
            x = lax.cos(lax.sin(x))
        return x

    return f"chain_{equations // 1000}k_ops", chain, (jnp.ones((512, 512), jnp.float32),)


def extra_programs() -> dict[str, tuple]:
    """Programs outside the acceptance set, kept to show where the model is weak or
    strong: ``name -> (fun, args)``."""
    wide = mlp_chain(layers=12, batch=512, width=1024)
    small = mlp_chain(layers=8, batch=1024, width=512)
    half_params = [w.astype(jnp.bfloat16) for w in small.params]
    half_x = small.batch.astype(jnp.bfloat16)
    half_loss = lambda p, x: small.loss_fn(p, x).astype(jnp.float32)
    base = mlp_chain()

    def checkpointed(wrap):     # 6 segments of 4 layers, each under ``wrap``
        def loss(params, x):
            for i in range(0, len(params), 4):
                def segment(h, ws=params[i:i + 4]):
                    for w in ws:
                        h = jnp.tanh(h @ w)
                    return h
                x = wrap(segment)(x)
            return jnp.mean(x**2)
        return jax.value_and_grad(loss)

    def scan_loss(ws, x):
        h, _ = lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
        return jnp.mean(h**2)

    tf = transformer()
    return {
        "mlp_12x1024_b512": (wide.step, (wide.params, wide.batch)),
        "mlp_bf16": (jax.value_and_grad(half_loss), (half_params, half_x)),
        "mlp_checkpointed": (checkpointed(jax.checkpoint), (base.params, base.batch)),
        "mlp_remat_checkpointed": (checkpointed(remat.checkpoint), (base.params, base.batch)),
        "mlp_scan": (jax.value_and_grad(scan_loss),
                     (jnp.stack(small.params), small.batch)),
        "transformer_forward_only": (tf.loss_fn, (tf.params, tf.batch)),
    }


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
    load_at_start = os.getloadavg()[0]
    # XLA fuses the whole 20k-op chain into one kernel and takes minutes to compile
    # it (197 s measured), so it is compiled only on request.
    compile_chain = "--compile-chain" in argv
    argv = [a for a in argv if a != "--compile-chain"]
    chain_name, chain_fun, chain_args = long_chain()
    extras = extra_programs()
    main_set = [*ALL_MODELS, chain_name]
    wanted = argv or [*main_set, *extras]
    rows, extra_rows = [], []
    for name in wanted:
        if name == chain_name:
            rows.append(measure(name, chain_fun, chain_args, compile_xla=compile_chain))
        elif name in ALL_MODELS:
            model: Model = ALL_MODELS[name]()
            rows.append(measure(name, model.step, (model.params, model.batch)))
        elif name in extras:
            extra_rows.append(measure(name, *extras[name]))
        else:
            raise SystemExit(f"unknown program {name!r}; choose from "
                             f"{[*main_set, *extras]}.")
        print(f"measured {name}", file=sys.stderr, flush=True)
    header = (f"jax {jax.__version__}, backend {jax.default_backend()}, "
              f"{os.cpu_count()} CPUs, {platform.machine()}; footprint = argument + output"
              " + temp - alias bytes; times are one cold call each (analyze includes "
              f"tracing); 1-minute load average {load_at_start:.1f} at the start, "
              f"{os.getloadavg()[0]:.1f} at the end (timings grow with it).\n\n")
    text = format_table(rows) if rows else ""
    if extra_rows:
        text += ("\n\nOther programs (not acceptance targets; they show where the model"
                 " holds and where it does not):\n\n" + format_table(extra_rows))
    if not compile_chain and chain_name in wanted:
        text += (f"\n\n{chain_name} is not compiled by default (XLA fuses the chain into "
                 "one kernel and took 197 s to compile it on this machine); pass "
                 "--compile-chain to include it.")
    print(text)
    if not argv:
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w") as f:
            f.write("# remat.analyze vs XLA (bench/bench_analyze.py)\n\n" + header + text + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

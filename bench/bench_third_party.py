"""Benchmark: the automatic pass on the training steps a new user writes.

Three programs, each asked for limits a person would pick, one fresh search per
limit (``remat.plan``, default settings, nothing cached from an earlier limit):

- ``mlp8``: ``jax.value_and_grad`` of an 8-layer ``tanh(x @ w + b)`` MLP (plain
  JAX, batch 1024, width 512) at 0.5 and at byte limits from 30 to 37 MiB;
- ``eqx_conv``: the gradient of an Equinox net of three 3x3 convolutions (32
  channels, 16 images of 32x32) at 0.75, 0.6, 0.5 and 0.3;
- ``resnet18_step``: a Haiku ResNet-18 train step (batch-norm state, optax SGD
  with momentum, 16 images of 64x64) at 0.75, 0.5 and 0.3.

For each limit: XLA's footprint of the answer (or the least reached, when
refused), its extra FLOPs over the plain program's, and the whole ``remat.plan``
call (tracing, planning, every compile) over one compile of the plain program.

Run from the repository root: ``python -m bench.bench_third_party [NAME ...]``.
Writes ``bench/results/third_party.md`` (every program) and prints the table.
"""

from __future__ import annotations

import sys
import time

import equinox as eqx
import haiku as hk
import jax
import jax.numpy as jnp
import optax

import remat
from bench.bench_generalization import footprint
from bench.output import result_file
from remat._jax.planner import forget_planners

MiB = 2**20


def mlp8():
    key = jax.random.PRNGKey(0)
    ws = [(jax.random.normal(jax.random.fold_in(key, i), (512, 512)) * 0.05,
           jnp.zeros(512)) for i in range(8)]
    x = jax.random.normal(key, (1024, 512))

    def loss(ws, x):
        for w, b in ws:
            x = jnp.tanh(x @ w + b)
        return jnp.sum(x ** 2)
    limits = [0.5, *(int(m * MiB) for m in (30, 30.5, 31, 31.5, 32, 33, 34, 35, 36, 37))]
    return jax.value_and_grad(loss), (ws, x), limits


def eqx_conv():
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    net = eqx.nn.Sequential([
        eqx.nn.Conv2d(3, 32, 3, padding=1, key=keys[0]), eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.Conv2d(32, 32, 3, padding=1, key=keys[1]), eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.Conv2d(32, 32, 3, padding=1, key=keys[2]), eqx.nn.Lambda(jax.nn.relu)])
    params, static = eqx.partition(net, eqx.is_array)
    x = jax.random.normal(keys[3], (16, 3, 32, 32))

    def loss(params, x):
        return jnp.mean(jax.vmap(eqx.combine(params, static))(x) ** 2)
    return jax.value_and_grad(loss), (params, x), [0.75, 0.6, 0.5, 0.3]


def resnet18_step():
    key = jax.random.PRNGKey(0)
    model = hk.transform_with_state(
        lambda x, training: hk.nets.ResNet18(num_classes=10)(x, is_training=training))
    x = jax.random.normal(key, (16, 64, 64, 3))
    y = jnp.zeros((16,), jnp.int32)
    params, state = model.init(key, x, True)
    opt = optax.sgd(0.1, momentum=0.9)

    def step(params, state, opt_state, x, y):
        def loss(p):
            logits, new_state = model.apply(p, state, None, x, True)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
            return ce.mean(), new_state
        (value, new_state), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state, opt_state, value
    return step, (params, state, opt.init(params), x, y), [0.75, 0.5, 0.3]


PROGRAMS = {"mlp8": mlp8, "eqx_conv": eqx_conv, "resnet18_step": resnet18_step}


def _limit(limit) -> str:
    return f"{limit:.2f}" if isinstance(limit, float) else f"{limit / MiB:.1f} MiB"


def rows(name: str) -> list[str]:
    """One table row per limit of program ``name``."""
    fun, args, limits = PROGRAMS[name]()
    lowered = jax.jit(fun).lower(*args)
    start = time.perf_counter()
    plain, _ = footprint(lowered.compile())
    compile_seconds = time.perf_counter() - start
    out = []
    for limit in limits:
        forget_planners()
        jax.clear_caches()
        start = time.perf_counter()
        try:
            p = remat.plan(fun, *args, memory_limit=limit)
            got = (f"{plain / MiB:.1f} -> {p.planned.total / MiB:.1f}", "met",
                   f"{p.extra_flops / 1e9:.2f}", p.algorithm)
        except remat.MemoryLimitError as e:
            stopped = "stopped at 40 plans" if "search stopped" in str(e) else "all tried"
            got = (f"{plain / MiB:.1f} -> {e.least_bytes / MiB:.1f} (least)",
                   "refused", "-", stopped)
        call = (time.perf_counter() - start) / compile_seconds
        out.append(f"| {name} | {_limit(limit)} | {got[0]} | {got[1]} | {got[2]} | "
                   f"{call:.1f} | {compile_seconds:.2f} | {got[3]} |")
        print(out[-1], flush=True)
    return out


HEADER = ("| program | limit | XLA footprint (MiB) | | extra GFLOP | first call ÷ "
          "compile | compile (s) | planned by |\n|---|---|---|---|---:|---:|---:|---|")


def main(argv: list[str]) -> None:
    names = argv or list(PROGRAMS)
    print(HEADER, flush=True)
    table = [row for name in names for row in rows(name)]
    if not argv:
        result_file("third_party").write_text(
            "# Third-party training steps\n\n`python -m bench.bench_third_party` "
            f"({jax.default_backend()}, jax {jax.__version__}). One fresh search per "
            "limit; a fraction is of the plain program's temporaries.\n\n"
            + HEADER + "\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

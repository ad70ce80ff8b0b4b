"""Benchmark: the automatic pass on the training steps a new user writes.

Three programs, each asked for limits a person would pick, one fresh search per
limit (``remat.plan``, default settings, nothing cached from an earlier limit):

- ``mlp8``: ``jax.value_and_grad`` of an 8-layer ``tanh(x @ w + b)`` MLP (plain
  JAX, batch 1024, width 512) at 0.5 and at byte limits from 30 to 37 MiB;
- ``eqx_conv``: the gradient of an Equinox net of three 3x3 convolutions (32
  channels, 16 images of 32x32) at 0.75, 0.6, 0.5 and 0.3;
- ``resnet18_step``: a Haiku ResNet-18 train step (batch-norm state, optax SGD
  with momentum, 16 images of 64x64) at 0.75, 0.5 and 0.3.

Each program also comes checkpointed by hand, as a user would write it: every
layer under ``jax.checkpoint`` and under ``remat.checkpoint``; every residual block
of the ResNet under ``hk.remat``. XLA's footprint of each is asked as one more
limit, where it is below the plain one: the pass should reach what a user reaches
by hand. And each is planned itself at 1.0 (``remat.plan`` of the program as
written, its baseline): the answer is the cheapest point within its footprint,
the user's own recomputation counted.

For each limit: XLA's footprint of the answer (or the least reached, when
refused), its extra FLOPs over the plain program's, and the whole ``remat.plan``
call (tracing, planning, every compile) over one compile of the plain program,
and over ``jax.jit``'s first call (tracing, lowering, compiling; nothing cached).

Run from the repository root: ``python -m bench.bench_third_party [NAME ...]``.
Writes ``bench/results/third_party.md`` (every program) and prints the table.
"""

from __future__ import annotations

import contextlib
import sys
import time

import equinox as eqx
import haiku as hk
import haiku._src.nets.resnet as hk_resnet
import jax
import jax.numpy as jnp
import optax

import remat
from bench.bench_auto import jit_first_call
from bench.bench_generalization import footprint
from bench.output import result_file
from remat._jax.planner import forget_planners

MiB = 2**20


def mlp8():
    key = jax.random.PRNGKey(0)
    ws = [(jax.random.normal(jax.random.fold_in(key, i), (512, 512)) * 0.05,
           jnp.zeros(512)) for i in range(8)]
    x = jax.random.normal(key, (1024, 512))

    def layer(w, b, x):
        return jnp.tanh(x @ w + b)

    def loss(ws, x, wrap=lambda f: f):
        for w, b in ws:
            x = wrap(layer)(w, b, x)
        return jnp.sum(x ** 2)
    limits = [0.5, *(int(m * MiB) for m in (30, 30.5, 31, 31.5, 32, 33, 34, 35, 36, 37))]
    hand = {f"{c.__module__.split('.')[0]}.checkpoint per layer":
            jax.value_and_grad(lambda ws, x, c=c: loss(ws, x, c))
            for c in (jax.checkpoint, remat.checkpoint)}
    return jax.value_and_grad(loss), (ws, x), limits, hand


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

    def loss_by_hand(params, x, checkpoint):
        net = eqx.combine(params, static)
        for conv, act in zip(net.layers[::2], net.layers[1::2]):
            x = checkpoint(lambda c, x, act=act: jax.vmap(lambda y: act(c(y)))(x))(conv, x)
        return jnp.mean(x ** 2)
    hand = {f"{c.__module__.split('.')[0]}.checkpoint per layer":
            jax.value_and_grad(lambda p, x, c=c: loss_by_hand(p, x, c))
            for c in (jax.checkpoint, remat.checkpoint)}
    return jax.value_and_grad(loss), (params, x), [0.75, 0.6, 0.5, 0.3], hand


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

    def step_by_hand(*args):
        with _haiku_blocks_checkpointed():
            return step(*args)
    return (step, (params, state, opt.init(params), x, y), [0.75, 0.5, 0.3],
            {"hk.remat per block": step_by_hand})


@contextlib.contextmanager
def _haiku_blocks_checkpointed():
    """Every residual block of Haiku's ResNet under ``hk.remat`` while tracing
    (its ResNet takes no checkpointing option)."""
    call = hk_resnet.BlockV1.__call__

    def checkpointed(self, inputs, is_training, test_local_stats):
        return hk.remat(lambda x: call(self, x, is_training, test_local_stats))(inputs)
    hk_resnet.BlockV1.__call__ = checkpointed
    try:
        yield
    finally:
        hk_resnet.BlockV1.__call__ = call


PROGRAMS = {"mlp8": mlp8, "eqx_conv": eqx_conv, "resnet18_step": resnet18_step}


def _limit(limit) -> str:
    return f"{limit:.2f}" if isinstance(limit, float) else f"{limit / MiB:.1f} MiB"


def rows(name: str) -> list[str]:
    """One table row per limit of program ``name``."""
    fun, args, limits, by_hand = PROGRAMS[name]()
    lowered = jax.jit(fun).lower(*args)
    start = time.perf_counter()
    plain, _ = footprint(lowered.compile())
    compile_seconds = time.perf_counter() - start
    jit_seconds = jit_first_call(fun, args)
    out, hand_limits = [], []
    for how, hand_fun in by_hand.items():
        hand, _ = footprint(jax.jit(hand_fun).lower(*args).compile())
        out.append(f"| {name} | by hand | {plain / MiB:.1f} -> {hand / MiB:.1f} | "
                   f"{'below plain' if hand < plain else 'not below plain'} | | | | "
                   f"{compile_seconds:.2f} | {how} |")
        print(out[-1], flush=True)
        out.append(_as_written_row(name, hand_fun, args, hand, how))
        print(out[-1], flush=True)
        if hand < plain:
            hand_limits.append(hand)
    for limit in [*limits, *hand_limits]:
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
        seconds = time.perf_counter() - start
        call, jit_call = seconds / compile_seconds, seconds / jit_seconds
        label = _limit(limit) + (" (by hand's)" if limit in hand_limits else "")
        out.append(f"| {name} | {label} | {got[0]} | {got[1]} | {got[2]} | "
                   f"{call:.1f} | {jit_call:.1f} | {compile_seconds:.2f} | {got[3]} |")
        print(out[-1], flush=True)
    return out


def _as_written_row(name, hand_fun, args, hand: int, how: str) -> str:
    """``remat.plan`` of the program checkpointed by hand, at 1.0: its baseline is
    the program as written (``hand``), and the answer the cheapest point within
    it, the user's own recomputation counted."""
    forget_planners()
    jax.clear_caches()
    p = remat.plan(hand_fun, *args, memory_limit=1.0)
    if abs(p.baseline.total - hand) > 0.001 * hand:   # measuring compiles: ~bytes off
        raise AssertionError(f"{name}, {how}: remat's baseline {p.baseline.total} is "
                             f"not XLA's footprint of the program as written {hand}")
    return (f"| {name} | 1.0 of it, by hand | {hand / MiB:.1f} -> "
            f"{p.planned.total / MiB:.1f} | {'met' if p.met else 'NOT met'} | "
            f"{p.extra_flops / 1e9:.2f} | | | | {how}: {p.algorithm} |")


HEADER = ("| program | limit | XLA footprint (MiB) | | extra GFLOP | first call ÷ "
          "compile | first call ÷ jax.jit's | compile (s) | planned by |\n"
          "|---|---|---|---|---:|---:|---:|---:|---|")


def main(argv: list[str]) -> None:
    names = argv or list(PROGRAMS)
    print(HEADER, flush=True)
    table = [row for name in names for row in rows(name)]
    if not argv:
        result_file("third_party").write_text(
            "# Third-party training steps\n\n`python -m bench.bench_third_party` "
            f"({jax.default_backend()}, jax {jax.__version__}). One fresh search per "
            "limit; a fraction is of the plain program's temporaries. Rows '1.0 of "
            "it, by hand': `remat.plan` of the program checkpointed by hand, whose "
            "baseline is that program as written; extra GFLOP counts the user's own "
            "recomputation where the answer is the program as written.\n\n"
            + HEADER + "\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

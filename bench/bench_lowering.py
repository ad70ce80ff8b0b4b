"""Benchmark: what recomputation costs in step time against what it costs in FLOPs.

For each program, the gradient step is compiled without remat and with it, and we
report XLA's own figures against no remat: temp bytes (``memory_analysis()``), FLOPs
(``cost_analysis()``), the median step time (every variant of a program timed in
turn, one step each per round, so that the machine's noise hits them alike), and
time ratio / FLOPs ratio: 1.0 when a recomputed FLOP costs what a forward FLOP does.

Conv programs: a plain-JAX NHWC conv net checkpointed in pairs of layers, an
Equinox-style NCHW conv net (convolutions applied per example under ``jax.vmap``)
checkpointed per residual block, and a small Haiku ResNet (strided and grouped
convolutions) checkpointed per block; each under ``remat.checkpoint`` (the
platform's default lowering, and ``lowering="cond"`` for comparison) and under
``remat.jit`` at 75% of the temporaries. Loop programs: a scanned transformer and a
scanned tanh chain, the scan body under ``jax.checkpoint`` and ``remat.checkpoint``
with each policy (``remat.jit`` cannot reach into a scan: one opaque equation).

Run from the repository root: ``python -m bench.bench_lowering`` (``--quick``: fewer
rounds). Writes ``bench/results/lowering.md``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import remat
from bench.output import result_file

Program = tuple[Callable, tuple]          # (loss(params, batch) builder, (params, batch))


def _normal(rng, shape, scale):
    return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)


def nhwc_convnet(wrap, batch=32, size=32, channels=32, layers=8, seed=0):
    """Stem conv, then ``layers`` 3x3 conv + tanh layers (NHWC, batched), in
    checkpointed pairs; mean-squared loss."""
    rng = np.random.default_rng(seed)
    scale = 1 / math.sqrt(9 * channels)
    params = {"stem": _normal(rng, (3, 3, 3, channels), 1 / math.sqrt(27)),
              "layers": [_normal(rng, (3, 3, channels, channels), scale)
                         for _ in range(layers)]}
    x = _normal(rng, (batch, size, size, 3), 1.0)
    conv = partial(jax.lax.conv_general_dilated, window_strides=(1, 1), padding="SAME",
                   dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def pair(ws, h):
        for w in ws:
            h = jnp.tanh(conv(h, w))
        return h

    def loss(params, x):
        h = conv(x, params["stem"])
        ws = params["layers"]
        for i in range(0, len(ws), 2):
            h = wrap(pair)(ws[i:i + 2], h)
        return jnp.mean(h ** 2)

    return loss, (params, x)


def equinox_convnet(wrap, batch=32, size=32, channels=32, blocks=4, seed=0):
    """The usual Equinox form: ``eqx.nn.Conv2d`` layers (channels-first, one example
    at a time) applied with ``jax.vmap``; stem conv and ``blocks`` residual blocks of
    two 3x3 convs, each block checkpointed."""
    import equinox as eqx

    keys = jax.random.split(jax.random.key(seed), 2 * blocks + 1)
    stem = eqx.nn.Conv2d(3, channels, 3, padding=1, key=keys[0])
    convs = [(eqx.nn.Conv2d(channels, channels, 3, padding=1, key=keys[2 * i + 1]),
              eqx.nn.Conv2d(channels, channels, 3, padding=1, key=keys[2 * i + 2]))
             for i in range(blocks)]
    x = _normal(np.random.default_rng(seed), (batch, 3, size, size), 1.0)

    def block(pair, h):
        a, b = pair
        return h + jax.vmap(b)(jax.nn.relu(jax.vmap(a)(jax.nn.relu(h))))

    def loss(params, x):
        stem, convs = params
        h = jax.vmap(stem)(x)
        for pair in convs:
            h = wrap(block)(pair, h)
        return jnp.mean(h ** 2)

    return loss, ((stem, convs), x)


def haiku_resnet(wrap, batch=16, size=32, widths=(32, 64), blocks=2, groups=4, seed=0):
    """A small ResNet of Haiku modules (NHWC, batched): per stage, ``blocks``
    residual blocks (3x3 conv, grouped 3x3 conv, layer norms); every stage after the
    first opens with a stride-2 block and a strided 1x1 projection. Each block is
    its own ``hk.transform``, so that ``wrap`` sees a pure function of its params."""
    import haiku as hk

    def block_fn(width, stride, x):
        h = hk.Conv2D(width, 3, stride=stride)(jax.nn.relu(x))
        h = hk.LayerNorm(-1, True, True)(h)
        h = hk.Conv2D(width, 3, feature_group_count=groups)(jax.nn.relu(h))
        h = hk.LayerNorm(-1, True, True)(h)
        if stride > 1 or x.shape[-1] != width:
            x = hk.Conv2D(width, 1, stride=stride)(x)
        return x + h

    rng = jax.random.key(seed)
    x = _normal(np.random.default_rng(seed), (batch, size, size, 3), 1.0)
    stem = hk.without_apply_rng(hk.transform(lambda x: hk.Conv2D(widths[0], 3)(x)))
    h = jnp.zeros((1, size, size, 3))
    params, applies = [stem.init(rng, h)], []
    h = stem.apply(params[0], h)
    for s, width in enumerate(widths):
        for b in range(blocks):
            stride = 2 if s > 0 and b == 0 else 1
            t = hk.without_apply_rng(hk.transform(partial(block_fn, width, stride)))
            rng, key = jax.random.split(rng)
            params.append(t.init(key, h))
            applies.append(t.apply)
            h = t.apply(params[-1], h)

    def loss(params, x):
        h = stem.apply(params[0], x)
        for apply, p in zip(applies, params[1:]):
            h = wrap(apply)(p, h)
        return jnp.mean(h ** 2)

    return loss, (params, x)


def scanned_transformer(wrap, layers=6, batch=8, seq=128, width=256, heads=4, seed=0):
    """A pre-LN transformer whose ``layers`` blocks run in one ``lax.scan`` over
    stacked weights; ``wrap`` is applied to the scan body."""
    rng = np.random.default_rng(seed)
    s = 1 / math.sqrt(width)
    params = {k: _normal(rng, (layers, width, n * width), s)
              for k, n in (("qkv", 3), ("out", 1), ("up", 4))}
    params["down"] = _normal(rng, (layers, 4 * width, width), s / 2)
    x = _normal(rng, (batch, seq, width), 1.0)

    def norm(h):
        return (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)

    def body(h, p):
        q, k, v = jnp.split(norm(h) @ p["qkv"], 3, axis=-1)
        split = lambda t: t.reshape(batch, seq, heads, width // heads)
        att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) /
                             math.sqrt(width // heads), axis=-1)
        h = h + jnp.einsum("bhqk,bkhd->bqhd", att, split(v)).reshape(h.shape) @ p["out"]
        return h + jax.nn.gelu(norm(h) @ p["up"]) @ p["down"], None

    def loss(params, x):
        h, _ = jax.lax.scan(wrap(body), x, params)
        return jnp.mean(h ** 2)

    return loss, (params, x)


def scanned_chain(wrap, layers=16, batch=512, width=256, seed=0):
    """``tanh(tanh(h @ w) @ w.T) + h`` for ``layers`` weights, in one ``lax.scan``."""
    rng = np.random.default_rng(seed)
    ws = _normal(rng, (layers, width, width), 1 / math.sqrt(width))
    x = _normal(rng, (batch, width), 1.0)

    def body(h, w):
        return jnp.tanh(jnp.tanh(h @ w) @ w.T) + h, None

    def loss(ws, x):
        h, _ = jax.lax.scan(wrap(body), x, ws)
        return jnp.mean(h ** 2)

    return loss, (ws, x)


CONV_PROGRAMS = {"plain-JAX NHWC conv net (pairs)": nhwc_convnet,
                 "Equinox NCHW vmapped conv net (blocks)": equinox_convnet,
                 "Haiku ResNet small (blocks; strided, grouped)": haiku_resnet}
LOOP_PROGRAMS = {"scanned 6-layer transformer (body)": scanned_transformer,
                 "scanned 16-layer tanh chain (body)": scanned_chain}
POLICIES = {"nothing saveable": None,
            "dots_with_no_batch_dims_saveable":
                jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
            "dots_saveable": jax.checkpoint_policies.dots_saveable}
JIT_FRACTION = 0.75


def _conv_variants(make):
    plain_loss, args = make(lambda f: f)
    step = jax.grad(plain_loss)
    yield "no remat", jax.jit(step).lower(*args).compile()
    yield "remat.checkpoint", jax.jit(jax.grad(make(remat.checkpoint)[0])).lower(*args).compile()
    cond = partial(remat.checkpoint, lowering="cond")
    yield 'remat.checkpoint(lowering="cond")', \
        jax.jit(jax.grad(make(cond)[0])).lower(*args).compile()
    try:
        plan = remat.plan(step, *args, memory_limit=JIT_FRACTION)
        yield f"remat.jit at {JIT_FRACTION:.0%}", plan.compiled
    except remat.MemoryLimitError as e:
        yield f"remat.jit at {JIT_FRACTION:.0%}", str(e).splitlines()[0]


def _loop_variants(make):
    args = make(lambda f: f)[1]
    yield "no remat", jax.jit(jax.grad(make(lambda f: f)[0])).lower(*args).compile()
    for name, policy in POLICIES.items():
        for wrapper in (jax.checkpoint, remat.checkpoint):
            label = f"{wrapper.__module__.split('.')[0]}.checkpoint, {name}"
            loss = make(partial(wrapper, policy=policy))[0]
            yield label, jax.jit(jax.grad(loss)).lower(*args).compile()


def measure(make, variants, rounds: int) -> list[dict]:
    """One row per variant of one program; ratios against the first (no remat)."""
    args = make(lambda f: f)[1]
    rows = []
    for label, compiled in variants(make):
        if isinstance(compiled, str):
            rows.append(dict(variant=label, refused=compiled))
            continue
        m = compiled.memory_analysis()
        rows.append(dict(variant=label, fn=compiled, temp=m.temp_size_in_bytes,
                         flops=compiled.cost_analysis()["flops"],
                         grads=jax.block_until_ready(compiled(*args)), times=[]))
    timed = [r for r in rows if "fn" in r]
    for _ in range(rounds):
        for r in timed:
            start = time.perf_counter()
            jax.block_until_ready(r["fn"](*args))
            r["times"].append(time.perf_counter() - start)
    want = jax.tree_util.tree_leaves(timed[0]["grads"])
    for r in timed:
        got = jax.tree_util.tree_leaves(r.pop("grads"))
        r["err"] = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(a)) + 1e-30))
                       for a, b in zip(want, got))
        r["time"] = float(np.median(r.pop("times")))
        del r["fn"]
    return rows


def table(results: dict[str, list[dict]]) -> str:
    lines = ["| program | variant | temp (MiB) | temp ratio | FLOPs ratio | "
             "median step (ms) | time ratio | time / FLOPs | max rel grad err |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for program, rows in results.items():
        base = rows[0]
        for r in rows:
            if "refused" in r:
                lines.append(f"| {program} | {r['variant']} | refused: {r['refused']} "
                             "| | | | | | |")
                continue
            fr, tr = r["flops"] / base["flops"], r["time"] / base["time"]
            lines.append(f"| {program} | {r['variant']} | {r['temp'] / 2**20:.1f} | "
                         f"{r['temp'] / base['temp']:.2f} | {fr:.2f} | "
                         f"{r['time'] * 1e3:.1f} | {tr:.2f} | {tr / fr:.2f} | "
                         f"{r['err']:.0e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 timed rounds, not 9")
    args = parser.parse_args()
    rounds = 3 if args.quick else 9
    results = {}
    for programs, variants in ((CONV_PROGRAMS, _conv_variants),
                               (LOOP_PROGRAMS, _loop_variants)):
        for name, make in programs.items():
            results[name] = measure(make, variants, rounds)
            print(table({name: results[name]}), flush=True)
    text = table(results)
    result_file("lowering").write_text(
        f"Device: {jax.devices()[0].device_kind} ({jax.default_backend()}), "
        f"jax {jax.__version__}, median of {rounds} steps per variant, timed in "
        f"turn. Ratios against no remat; time / FLOPs = time ratio / FLOPs ratio. "
        f"Loop programs have no remat.jit row: the scan is one equation to the "
        f"automatic pass, which refuses every limit below the plain program.\n\n"
        f"{text}\n")


if __name__ == "__main__":
    main()

"""Benchmark: the automatic pass on an SPMD train step, per device.

A small transformer (pre-LN blocks: attention and an MLP), its train step with
optax's Adam, on 8 simulated CPU devices as a 4x2 mesh ('data', 'model'): the batch
split over 'data', the attention heads and the MLP's hidden units over 'model'
(Megatron-style), activations constrained to the batch split. ``remat.jit`` is
asked for 75%, 50% and 30% of the plain step's per-device temporaries. For each:
XLA's per-device footprint against the limit, XLA's FLOPs and the median step time
against the plain step's. Writes ``bench/results/sharding.md``.

Run: ``python -m bench.bench_sharding [--quick]`` (sets ``XLA_FLAGS`` itself, before
JAX starts).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import re        # noqa: E402
import time      # noqa: E402

import jax       # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np       # noqa: E402
import optax     # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import remat     # noqa: E402
from bench.output import result_file  # noqa: E402


def make_step(mesh, blocks: int, batch: int, seq: int, width: int, heads: int):
    """The train step, its parameters, optimizer state and batch, placed on ``mesh``."""
    act = NamedSharding(mesh, P("data", None, None))
    opt = optax.adam(1e-3)
    keys = iter(jax.random.split(jax.random.key(0), 4 * blocks + 1))
    dense = lambda shape: jax.random.normal(next(keys), shape) / shape[0] ** 0.5
    params = [dict(qkv=dense((width, 3 * width)), out=dense((width, width)),
                   up=dense((width, 4 * width)), down=dense((4 * width, width)))
              for _ in range(blocks)]
    spec = dict(qkv=P(None, "model"), out=P("model", None), up=P(None, "model"),
                down=P("model", None))
    params = [{k: jax.device_put(v, NamedSharding(mesh, spec[k])) for k, v in p.items()}
              for p in params]
    x = jax.device_put(jax.random.normal(next(keys), (batch, seq, width)), act)

    def norm(h):
        return (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True)
                                                               + 1e-5)

    def block(p, h):
        q, k, v = jnp.split(norm(h) @ p["qkv"], 3, axis=-1)
        split = lambda t: t.reshape(batch, seq, heads, width // heads)
        att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k))
                             / (width // heads) ** 0.5, axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", att, split(v)).reshape(batch, seq, width)
        h = jax.lax.with_sharding_constraint(h + o @ p["out"], act)
        h = h + jax.nn.gelu(norm(h) @ p["up"]) @ p["down"]
        return jax.lax.with_sharding_constraint(h, act)

    def loss(params, x):
        h = x
        for p in params:
            h = block(p, h)
        return jnp.mean((h - x) ** 2)

    def step(params, state, x):
        grads = jax.grad(loss)(params, x)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return step, (params, opt.init(params), x)


def _median_seconds(fn, args, rounds: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _flops(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", 0.0))


def run(quick: bool) -> list[dict]:
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    size = dict(blocks=2, batch=8, seq=64, width=64, heads=4) if quick else dict(
        blocks=4, batch=16, seq=128, width=128, heads=4)
    rounds = 3 if quick else 10
    step, args = make_step(mesh, **size)
    plain = jax.jit(step).lower(*args).compile()
    m = plain.memory_analysis()
    plain_total = (m.argument_size_in_bytes + m.output_size_in_bytes +
                   m.temp_size_in_bytes - m.alias_size_in_bytes)
    plain_time = _median_seconds(plain, args, rounds)
    plain_flops = _flops(plain)
    expected = jax.tree.leaves(plain(*args))
    rows = [dict(fraction="plain", limit=None, total=plain_total,
                 temp=m.temp_size_in_bytes, flops=1.0, time=1.0, met="", diff=None)]
    for fraction in (0.75, 0.5, 0.3):
        try:
            p = remat.plan(step, *args, memory_limit=fraction)
        except remat.MemoryLimitError as e:
            least = re.search(r"the least reached is ([\d.]+ \w+)", str(e))
            rows.append(dict(fraction=fraction, limit=None, total=None, temp=None,
                             flops=None, time=None, diff=None,
                             met=f"refused (least reached {least.group(1) if least else '?'})"))
            continue
        got = jax.tree.leaves(p.compiled(*args))
        diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(expected, got))
        rows.append(dict(fraction=fraction, limit=p.limit_bytes, total=p.planned.total,
                         temp=p.planned.temp, flops=_flops(p.compiled) / plain_flops,
                         time=_median_seconds(p.compiled, args, rounds) / plain_time,
                         met="met" if p.met else "NOT met", diff=diff))
    return [dict(r, size=size) for r in rows]


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2 ** 20:.2f}"


def write(rows: list[dict], quick: bool) -> None:
    size = rows[0]["size"]
    lines = [
        "# The automatic pass on an SPMD train step (per device)",
        "",
        f"Transformer train step (Adam), {size['blocks']} blocks, batch {size['batch']}, "
        f"seq {size['seq']}, width {size['width']}, {size['heads']} heads; 8 simulated "
        "CPU devices as a 4x2 mesh ('data', 'model'): batch over 'data', heads and MLP "
        "units over 'model'. Figures are XLA's, per device (`memory_analysis()` of the "
        "partitioned program); FLOPs from `cost_analysis()`; time is the median step "
        f"time against the plain step's{' (--quick)' if quick else ''}; max abs diff: "
        "the largest difference of the new parameters and optimizer state from the "
        "plain step's.",
        "",
        "| limit | limit MiB | footprint MiB | temp MiB | FLOPs x | time x | max abs diff | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratio = lambda x: "-" if x is None else f"{x:.2f}"
    sci = lambda x: "-" if x is None else f"{x:.1e}"
    for r in rows:
        frac = r["fraction"] if r["fraction"] == "plain" else f"{int(100 * r['fraction'])}%"
        lines.append(f"| {frac} | {_mib(r['limit'])} | {_mib(r['total'])} | "
                     f"{_mib(r['temp'])} | {ratio(r['flops'])} | {ratio(r['time'])} | "
                     f"{sci(r['diff'])} | {r['met']} |")
    path = result_file("sharding")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model, 3 rounds")
    quick = parser.parse_args().quick
    write(run(quick), quick)


if __name__ == "__main__":
    main()

"""SPMD programs on 8 simulated CPU devices, planned by the automatic pass.

Run as a script (``python -m tests.jax.sharded_programs CASE[:FRACTION[:ALGORITHM]]
...``): it sets
``XLA_FLAGS`` before JAX starts, so that the rest of the test suite keeps its one
device; ``test_sharding.py`` runs it in a subprocess. For each case it plans the
program (by default at half the plain program's per-device temporaries, with the
default settings unless an algorithm is named) and prints one JSON
line: XLA's per-device figures of both programs, the largest gradient difference,
and whether the output shardings are the plain program's.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8")

import json      # noqa: E402
import re        # noqa: E402
import sys       # noqa: E402

import jax       # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import remat     # noqa: E402
from remat._jax.planner import _PLANNERS  # noqa: E402

LAYERS, BATCH, WIDTH = 8, 1024, 512
FRACTION = 0.5


def _mesh(axis_type=AxisType.Auto):
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)


def _inputs(mesh, w_spec, x_spec, batch=BATCH, width=WIDTH):
    keys = jax.random.split(jax.random.key(0), LAYERS + 1)
    ws = [jax.device_put(jax.random.normal(k, (width, width)) / width ** 0.5,
                         NamedSharding(mesh, w_spec)) for k in keys[:-1]]
    x = jax.device_put(jax.random.normal(keys[-1], (batch, width)),
                       NamedSharding(mesh, x_spec))
    return ws, x


def data_parallel():
    """Weights replicated, the batch split over all 8 devices."""
    mesh = _mesh()

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x ** 2)
    return jax.grad(loss), _inputs(mesh, P(), P(("data", "model"), None)), {}


def flax_layers():
    """A Flax MLP (Dense, LayerNorm, gelu, dropout) whose batch is split over all 8
    devices: the plans' regions return split activations made from replicated
    parameters, which XLA's partitioner makes whole on every device unless the
    regions' results carry their shardings."""
    import flax.linen as nn
    mesh = _mesh()

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(6):
                x = nn.gelu(nn.LayerNorm()(nn.Dense(WIDTH)(x)))
                x = nn.Dropout(0.1, deterministic=False)(x)
            return x

    model = MLP()
    x = jax.device_put(jax.random.normal(jax.random.key(0), (4 * BATCH, WIDTH)),
                       NamedSharding(mesh, P(("data", "model"), None)))
    params = jax.device_put(model.init(jax.random.key(1), x[:8]),
                            NamedSharding(mesh, P()))
    def loss(p, x, key):
        return jnp.sum(model.apply(p, x, rngs={"dropout": key}) ** 2)
    return jax.grad(loss), (params, x, jax.random.key(2)), {}


def two_dim():
    """Weights split over 'model', activations constrained to the 'data' split."""
    mesh = _mesh()
    act = NamedSharding(mesh, P("data", None))

    def loss(ws, x):
        for w in ws:
            x = jax.lax.with_sharding_constraint(jnp.tanh(x @ w), act)
        return jnp.sum(x ** 2)
    return jax.grad(loss), _inputs(mesh, P(None, "model"), P("data", None)), {}


def fsdp():
    """Weights split over all devices by rows, gathered whole before each layer."""
    mesh = _mesh()
    whole = NamedSharding(mesh, P())

    def loss(ws, x):
        for w in ws:
            w = jax.lax.with_sharding_constraint(w, whole)
            x = jnp.tanh(x @ w)
        return jnp.sum(x ** 2)
    rows = NamedSharding(mesh, P(("data", "model"), None))

    def grads(ws, x):     # reduce-scattered back to the weights' own split
        return [jax.lax.with_sharding_constraint(g, rows) for g in jax.grad(loss)(ws, x)]
    # A batch large against the weights, as where FSDP is used: XLA combines the
    # weight gradients' reductions into one, which holds them all at once.
    return grads, _inputs(mesh, P(("data", "model"), None), P(("data", "model"), None),
                          batch=16 * BATCH, width=WIDTH // 8), {}


def shard_map_psum():
    """The loss per device under ``shard_map``, summed over the batch by ``psum``."""
    mesh = _mesh()

    def loss(ws, x):
        def local(ws, x):
            for w in ws:
                x = jnp.tanh(x @ w)
            return jax.lax.psum(jnp.sum(x ** 2), "data")
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")),
                             out_specs=P())(ws, x)
    return jax.grad(loss), _inputs(mesh, P(), P("data", None), batch=8 * BATCH,
                                   width=WIDTH // 4), {}


def explicit():
    """An explicit-sharding mesh: the avals carry the shardings."""
    mesh = _mesh(AxisType.Explicit)

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x ** 2)
    with jax.set_mesh(mesh):
        args = _inputs(mesh, P(), P("data", None))
    return jax.grad(loss), args, {}


def in_out_shardings():
    """``in_shardings``, ``out_shardings`` and ``donate_argnums`` pass to jax.jit."""
    mesh = _mesh()
    w_s, x_s = NamedSharding(mesh, P(None, "model")), NamedSharding(mesh, P("data"))

    def step(ws, x):
        grads = jax.grad(lambda ws, x: _mlp_loss(ws, x))(ws, x)
        return [w - 0.1 * g for w, g in zip(ws, grads)]
    jit_kwargs = dict(in_shardings=([w_s] * LAYERS, x_s), out_shardings=[w_s] * LAYERS,
                      donate_argnums=(0,))
    ws, x = _inputs(mesh, P(None, "model"), P("data", None))
    return step, (ws, x), jit_kwargs


def _mlp_loss(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


def accumulated():
    """The gradient accumulated over 4 microbatches in a scan, each split over all
    8 devices (``in_shardings``): the pass plans inside the loop."""
    mesh = _mesh()
    w_s, x_s = NamedSharding(mesh, P()), NamedSharding(mesh, P(None, ("data", "model")))

    def step(ws, xs):
        def add(total, x):
            return [t + g for t, g in zip(total, jax.grad(_mlp_loss)(ws, x))], None
        return jax.lax.scan(add, [jnp.zeros_like(w) for w in ws], xs)[0]
    ws, _ = _inputs(mesh, P(), P())
    xs = jax.device_put(jax.random.normal(jax.random.key(5), (4, BATCH, WIDTH)), x_s)
    return step, (ws, xs), dict(in_shardings=([w_s] * LAYERS, x_s))


CASES = {f.__name__: f for f in (data_parallel, two_dim, fsdp, shard_map_psum, explicit,
                                 in_out_shardings, accumulated, flax_layers)}


def run(name: str, fraction: float = FRACTION, algorithm: str | None = None) -> dict:
    fun, args, jit_kwargs = CASES[name]()
    mesh_ctx = (jax.set_mesh(args[1].sharding.mesh) if name == "explicit"
                else _null())
    with mesh_ctx:
        donated = "donate_argnums" in jit_kwargs
        copy = lambda a: jax.tree.map(lambda v: v.copy(), a)
        plain_fn = jax.jit(fun, **jit_kwargs)
        plain_c = plain_fn.lower(*args).compile()
        plain = plain_c(*copy(args)) if donated else plain_c(*args)
        chosen = {"algorithm": algorithm} if algorithm else {}     # None: the default
        step = remat.jit(fun, memory_limit=fraction, **chosen, **jit_kwargs)
        p = step.plan_for(*args)
        got = step(*copy(args)) if donated else step(*args)
    m = plain_c.memory_analysis()
    gathers = lambda text: len(re.findall(r" all-gather(?:-start)?\(", text))
    added_gathers = gathers(step.lower(*args).compile().as_text()) - gathers(plain_c.as_text())
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(plain), jax.tree.leaves(got)))
    scale = max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(plain))
    same_shardings = all(a.sharding.is_equivalent_to(b.sharding, a.ndim) for a, b in
                         zip(jax.tree.leaves(plain), jax.tree.leaves(got)))
    return dict(case=name, fraction=fraction, algorithm=algorithm, met=p.met, limit=p.limit_bytes,
                plain_total=p.baseline.total, plain_temp=m.temp_size_in_bytes,
                planned_total=p.planned.total, planned_temp=p.planned.temp,
                temp_ratio=p.planned.temp / max(m.temp_size_in_bytes, 1),
                regions=len(p.result.regions), recomputed=p.recomputed,
                max_diff=diff, scale=scale, same_shardings=same_shardings,
                added_gathers=added_gathers, devices=jax.device_count(),
                gated_columns=sum("(gate)" in c.name for c in
                                  list(_PLANNERS.values())[-1].frontier.columns))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    for arg in [a for a in sys.argv[1:] if a != "-v"] or list(CASES):
        case, fraction, algorithm = (arg.split(":") + ["", ""])[:3]  # CASE[:FRACTION[:ALG]]
        try:
            result = run(case, float(fraction or FRACTION), algorithm or None)
        except Exception as e:   # noqa: BLE001 - reported to the test as a failure
            result = dict(case=case, error=f"{type(e).__name__}: {e}")
        result.pop("recomputed", None) if "-v" not in sys.argv else None
        print(json.dumps(result), flush=True)

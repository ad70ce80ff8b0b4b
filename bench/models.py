"""Benchmark programs shared by every `remat` benchmark.

Each builder returns a :class:`Model`: a scalar ``loss_fn(params, batch)``, the
``params`` pytree and one ``batch``. The program a benchmark usually studies is the
training gradient, ``jax.value_and_grad(loss_fn)(params, batch)``; ``Model.step``
builds it for you::

    from bench.models import mlp_chain
    model = mlp_chain(layers=4, batch=8, width=16)
    loss, grads = model.step(model.params, model.batch)

Builders take their sizes as keyword arguments; the defaults are the sizes of the
benchmark tables (``bench/bench_analyze.py``). Weights are random but seeded, so
every run sees the same numbers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Model", "mlp_chain", "transformer", "unet", "resnet50", "ALL_MODELS"]


@dataclasses.dataclass(frozen=True)
class Model:
    """A loss, its parameters and one batch.

    Attributes:
      name: short name used in benchmark tables.
      loss_fn: ``loss_fn(params, batch) -> scalar``.
      params: pytree of arrays the gradient is taken with respect to.
      batch: pytree of arrays (inputs, targets, and for stateful models their state).
    """

    name: str
    loss_fn: Callable[[Any, Any], jax.Array]
    params: Any
    batch: Any

    @property
    def step(self) -> Callable[[Any, Any], tuple[jax.Array, Any]]:
        """``step(params, batch) -> (loss, grads)``: the training gradient."""
        return jax.value_and_grad(self.loss_fn)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale)


def _identity(f: Callable) -> Callable:
    return f


def mlp_chain(layers: int = 24, batch: int = 2048, width: int = 512, seed: int = 0,
              segment: int = 4, wrap: Callable[[Callable], Callable] = _identity) -> Model:
    """A chain of ``layers`` layers ``h = tanh(h @ W)``; loss ``mean(h ** 2)``.

    The layers run in segments of ``segment`` layers, each segment passed through
    ``wrap`` (e.g. ``remat.checkpoint``; the identity by default).
    """
    rng = np.random.default_rng(seed)
    params = [_normal(rng, (width, width), 1.0 / math.sqrt(width)) for _ in range(layers)]
    x = _normal(rng, (batch, width), 1.0)

    def run_segment(ws, h):
        for w in ws:
            h = jnp.tanh(h @ w)
        return h

    segment_fn = wrap(run_segment)

    def loss_fn(params, x):
        h = x
        for start in range(0, layers, segment):
            h = segment_fn(params[start:start + segment], h)
        return jnp.mean(h**2)

    return Model("mlp_chain", loss_fn, params, x)


def _layer_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale


def transformer(
    blocks: int = 8, batch: int = 8, seq: int = 256, width: int = 256, heads: int = 4,
    seed: int = 0, wrap: Callable[[Callable], Callable] = _identity,
) -> Model:
    """A pre-norm transformer stack in plain JAX (causal attention, MLP 4x width).

    The loss is the mean squared error between the stack's output and a target.
    Each block is passed through ``wrap`` (e.g. ``remat.checkpoint``).
    """
    rng = np.random.default_rng(seed)
    scale = 1.0 / math.sqrt(width)
    params = [
        {
            "ln1": jnp.ones((width,), jnp.float32),
            "qkv": _normal(rng, (width, 3 * width), scale),
            "out": _normal(rng, (width, width), scale),
            "ln2": jnp.ones((width,), jnp.float32),
            "up": _normal(rng, (width, 4 * width), scale),
            "down": _normal(rng, (4 * width, width), 0.5 * scale),
        }
        for _ in range(blocks)
    ]
    x = _normal(rng, (batch, seq, width), 1.0)
    target = _normal(rng, (batch, seq, width), 1.0)
    head_dim = width // heads
    causal = np.tril(np.ones((seq, seq), dtype=bool))

    def attention(p, x):
        q, k, v = jnp.split(_layer_norm(x, p["ln1"]) @ p["qkv"], 3, axis=-1)
        split_heads = lambda t: t.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)
        q, k, v = split_heads(q), split_heads(k), split_heads(v)
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(head_dim)
        scores = jnp.where(causal, scores, -1e9)
        mixed = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
        return mixed.transpose(0, 2, 1, 3).reshape(batch, seq, width) @ p["out"]

    def mlp(p, x):
        return jax.nn.gelu(_layer_norm(x, p["ln2"]) @ p["up"]) @ p["down"]

    def block(p, x):
        x = x + attention(p, x)
        return x + mlp(p, x)

    block_fn = wrap(block)

    def loss_fn(params, batch_):
        x, target = batch_
        for p in params:
            x = block_fn(p, x)
        return jnp.mean((x - target) ** 2)

    return Model("transformer", loss_fn, params, (x, target))


def _conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    return jax.lax.conv_general_dilated(
        x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def unet(
    levels: int = 4, batch: int = 8, size: int = 64, base_channels: int = 16,
    in_channels: int = 3, seed: int = 0,
) -> Model:
    """A small U-Net: a DAG with a skip connection at every level.

    Down path: two 3x3 convs + ReLU per level, then a stride-2 conv. Up path:
    nearest-neighbour upsampling, concatenation with the skip, two 3x3 convs.
    The loss is the mean squared error against a target image.
    """
    rng = np.random.default_rng(seed)

    def conv_w(cin, cout, k=3):
        return _normal(rng, (k, k, cin, cout), 1.0 / math.sqrt(k * k * cin))

    channels = [base_channels * 2**i for i in range(levels + 1)]
    params = {"stem": conv_w(in_channels, channels[0]), "down": [], "up": []}
    for i in range(levels):
        params["down"].append({
            "a": conv_w(channels[i], channels[i]),
            "b": conv_w(channels[i], channels[i]),
            "pool": conv_w(channels[i], channels[i + 1], 2),
        })
    params["mid"] = conv_w(channels[levels], channels[levels])
    for i in reversed(range(levels)):
        params["up"].append({
            "reduce": conv_w(channels[i + 1], channels[i], 1),
            "a": conv_w(2 * channels[i], channels[i]),
            "b": conv_w(channels[i], channels[i]),
        })
    params["head"] = conv_w(channels[0], in_channels, 1)
    x = _normal(rng, (batch, size, size, in_channels), 1.0)
    target = _normal(rng, (batch, size, size, in_channels), 1.0)

    def loss_fn(params, batch_):
        x, target = batch_
        h = jax.nn.relu(_conv(x, params["stem"]))
        skips = []
        for p in params["down"]:
            h = jax.nn.relu(_conv(h, p["a"]))
            h = jax.nn.relu(_conv(h, p["b"]))
            skips.append(h)
            h = jax.nn.relu(_conv(h, p["pool"], stride=2))
        h = jax.nn.relu(_conv(h, params["mid"]))
        for p, skip in zip(params["up"], reversed(skips)):
            h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)
            h = _conv(h, p["reduce"])
            h = jnp.concatenate([h, skip], axis=-1)
            h = jax.nn.relu(_conv(h, p["a"]))
            h = jax.nn.relu(_conv(h, p["b"]))
        out = _conv(h, params["head"])
        return jnp.mean((out - target) ** 2)

    return Model("unet", loss_fn, params, (x, target))


def resnet50(batch: int = 16, size: int = 64, num_classes: int = 10, seed: int = 0) -> Model:
    """haiku's ``hk.nets.ResNet50`` in training mode (batch norm statistics updated).

    ``batch`` is ``(state, images, labels)``: the batch-norm state travels with the
    data so that ``loss_fn(params, batch)`` stays a plain scalar function.
    Needs dm-haiku.
    """
    import haiku as hk

    def forward(images, is_training):
        return hk.nets.ResNet50(num_classes)(images, is_training=is_training)

    net = hk.without_apply_rng(hk.transform_with_state(forward))
    rng = np.random.default_rng(seed)
    images = _normal(rng, (batch, size, size, 3), 1.0)
    labels = jnp.asarray(rng.integers(0, num_classes, size=(batch,)), jnp.int32)
    params, state = net.init(jax.random.PRNGKey(seed), images, True)

    def loss_fn(params, batch_):
        state, images, labels = batch_
        logits, _ = net.apply(params, state, images, True)
        log_probs = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))

    return Model("resnet50", loss_fn, params, (state, images, labels))


#: The benchmark programs by name, in table order.
ALL_MODELS: dict[str, Callable[..., Model]] = {
    "mlp_chain": mlp_chain,
    "transformer": transformer,
    "unet": unet,
    "resnet50": resnet50,
}

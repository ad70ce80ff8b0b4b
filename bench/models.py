"""Benchmark models in plain JAX, shared by the benchmarks and the demo.

Each ``make_*`` function returns ``(loss, params, batch)`` with ``loss(params,
batch) -> scalar``. ``wrap`` is applied to every checkpointable unit (a block or a
segment of layers) before it is called: pass ``jax.checkpoint`` or
``remat.checkpoint`` to checkpoint each unit, or leave it as the identity.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

Wrap = Callable[[Callable], Callable]


def _identity(f: Callable) -> Callable:
  return f


def make_chain(layers: int = 24, batch: int = 2048, width: int = 512,
               segment: int = 4, wrap: Wrap = _identity, seed: int = 0):
  """A chain of ``layers`` dense layers ``h = tanh(h @ W)``, grouped in segments
  of ``segment`` layers, each segment passed through ``wrap``."""
  keys = jax.random.split(jax.random.key(seed), layers + 1)
  params = [jax.random.normal(k, (width, width)) / np.sqrt(width) for k in keys[:-1]]
  batch_x = jax.random.normal(keys[-1], (batch, width))

  def run_segment(ws, h):
    for w in ws:
      h = jnp.tanh(h @ w)
    return h

  step = wrap(run_segment)

  def loss(params, x):
    h = x
    for start in range(0, layers, segment):
      h = step(params[start:start + segment], h)
    return jnp.mean(h ** 2)

  return loss, params, batch_x


def _layer_norm(x, scale):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale


def transformer_block(p, x, heads: int):
  """A pre-norm transformer block: causal self-attention, then a GELU MLP."""
  b, s, d = x.shape
  h = _layer_norm(x, p["ln1"])
  q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
  split = lambda t: t.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)
  q, k, v = split(q), split(k), split(v)
  scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
  mask = jnp.tril(jnp.ones((s, s), bool))
  attn = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
  out = (attn @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
  x = x + out @ p["proj"]
  h = _layer_norm(x, p["ln2"])
  return x + jax.nn.gelu(h @ p["up"]) @ p["down"]


def make_transformer(blocks: int = 8, batch: int = 8, seq: int = 256,
                     width: int = 256, heads: int = 4, wrap: Wrap = _identity,
                     seed: int = 0):
  """A stack of ``blocks`` transformer blocks on random embeddings, each block
  passed through ``wrap``; the loss is the mean square of the output."""
  keys = iter(jax.random.split(jax.random.key(seed), 5 * blocks + 1))
  init = lambda shape: jax.random.normal(next(keys), shape) / np.sqrt(shape[0])
  params = [dict(ln1=jnp.ones(width), ln2=jnp.ones(width),
                 qkv=init((width, 3 * width)), proj=init((width, width)),
                 up=init((width, 4 * width)), down=init((4 * width, width)))
            for _ in range(blocks)]
  x = jax.random.normal(next(keys), (batch, seq, width))
  block = wrap(lambda p, h: transformer_block(p, h, heads))

  def loss(params, x):
    h = x
    for p in params:
      h = block(p, h)
    return jnp.mean(h ** 2)

  return loss, params, x

"""Random gradient programs, one per seed, built from plain JAX blocks.

``random_program(seed)`` returns a :class:`Program`: a chain of blocks (each a
function ``apply(params, h) -> h``), their parameters, one input and one target, and
a scalar loss (the mean squared error of the chain's output against the target).
The program a benchmark studies is the training gradient,
``jax.value_and_grad(program.loss)(program.params, program.inputs)``.

Three families, chosen by the seed:

- ``dense``: activations ``[batch, width]``; dense layers (tanh, relu or gelu) and
  residual two-layer blocks.
- ``sequence``: activations ``[batch, seq, width]``; attention (one or several heads,
  softmax, pre-layer-norm, causal or not) with a residual connection, residual MLPs
  and dense layers.
- ``image``: activations ``[batch, height, width, channels]`` (NHWC); 3x3 and 1x1
  convolutions of stride 1 or 2, residual convolution pairs, max and average pooling;
  some programs end with a global average pool and dense layers.

Any block may compute in bfloat16 (its input and weights cast down, its output cast
back to float32; parameters and the loss stay float32). Sizes and depths are drawn so
that the plain gradient's XLA footprint is a few MiB to a few tens of MiB and compiles
in well under two seconds on a CPU: small enough for a test, large enough for
rematerialization to matter.

The same seed always gives the same program (a NumPy ``Generator`` draws every
choice and every array). Since the program is a list of blocks, a hand-written
segmentation is one line: ``program.segmented_loss(2)`` checkpoints each pair of
consecutive blocks with ``remat.checkpoint``.

>>> p = random_program(3)
>>> loss, grads = jax.value_and_grad(p.loss)(p.params, p.inputs)
>>> len(grads) == len(p.blocks)
True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Block", "Program", "random_program", "FAMILIES"]

FAMILIES = ("dense", "sequence", "image")

#: The range of activation bytes (float32 elements times four, summed over every
#: block's main intermediates) one program holds: it keeps the plain footprint
#: between a few MiB and a few tens of MiB. The drawn batch is halved while the
#: estimate is over the range, doubled while under it.
_ACTIVATION_BYTES = (3 * 2**20, 40 * 2**20)


@dataclasses.dataclass(frozen=True)
class Block:
    """One block of a program.

    Attributes:
      kind: ``"dense"``, ``"residual"``, ``"attention"``, ``"mlp"``, ``"conv"``,
        ``"residual_conv"``, ``"pool"`` or ``"head"`` (global pool then dense).
      description: the block in words, with its sizes and dtype.
      apply: ``apply(params, h) -> h``.
    """
    kind: str
    description: str
    apply: Callable[[Any, jax.Array], jax.Array] = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class Program:
    """A random gradient program: a chain of blocks and its data.

    Attributes:
      name: ``"rp<seed>"``.
      seed: the seed it was drawn from.
      family: one of :data:`FAMILIES`.
      blocks: the chain; block ``i`` takes ``params[i]``.
      params: one pytree of float32 arrays per block (empty for pooling).
      inputs: ``(x, target)``, float32 arrays.
      description: the whole program in words (distinct seeds give distinct ones).
    """
    name: str
    seed: int
    family: str
    blocks: tuple[Block, ...]
    params: tuple[Any, ...]
    inputs: tuple[jax.Array, jax.Array]
    description: str

    def forward(self, params, x, segment: int = 0,
                wrap: Callable[[Callable], Callable] | None = None) -> jax.Array:
        """The chain applied to ``x``; with ``segment > 0``, each run of ``segment``
        consecutive blocks is one function passed through ``wrap``."""
        if segment <= 0:
            for block, p in zip(self.blocks, params):
                x = block.apply(p, x)
            return x
        for start in range(0, len(self.blocks), segment):
            group = self.blocks[start:start + segment]

            def run(ps, h, group=group):
                for block, p in zip(group, ps):
                    h = block.apply(p, h)
                return h

            x = wrap(run)(tuple(params[start:start + segment]), x)
        return x

    def loss(self, params, inputs) -> jax.Array:
        """The mean squared error of the chain's output against the target."""
        x, target = inputs
        return jnp.mean((self.forward(params, x) - target) ** 2)

    def segmented_loss(self, segment: int,
                       wrap: Callable[[Callable], Callable] | None = None
                       ) -> Callable[[Any, Any], jax.Array]:
        """:meth:`loss` with each run of ``segment`` consecutive blocks wrapped
        (``remat.checkpoint`` unless ``wrap`` is given): the same values."""
        if segment < 1:
            raise ValueError(f"segmented_loss: segment must be >= 1 (blocks per "
                             f"checkpoint), got {segment!r}.")
        if wrap is None:
            import remat
            wrap = remat.checkpoint

        def loss(params, inputs):
            x, target = inputs
            return jnp.mean((self.forward(params, x, segment, wrap) - target) ** 2)

        return loss

    @property
    def step(self) -> Callable:
        """``step(params, inputs) -> (loss, grads)``: the training gradient."""
        return jax.value_and_grad(self.loss)


# ------------------------------------------------------------------ building blocks

_ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu, "gelu": jax.nn.gelu}


def _cast(dtype, p, h):
    """The block's weights and input in its compute dtype."""
    return jax.tree_util.tree_map(lambda a: a.astype(dtype), p), h.astype(dtype)


def _in_dtype(dtype, fn):
    """``fn`` computed in ``dtype``, taking and returning float32."""
    if dtype == jnp.float32:
        return fn
    return lambda p, h: fn(*_cast(dtype, p, h)).astype(jnp.float32)


def _layer_norm(x, scale):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale


def _conv(x, w, stride):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


class _Builder:
    """Draws blocks for one program: each method returns (block, params, the
    output's shape without the batch axis, activation elements per example)."""

    def __init__(self, rng: np.random.Generator, bf16_share: float):
        self.rng = rng
        self.bf16_share = bf16_share

    def normal(self, shape, fan_in):
        return jnp.asarray(self.rng.standard_normal(shape, dtype=np.float32)
                           / math.sqrt(fan_in))

    def dtype(self):
        return jnp.bfloat16 if self.rng.random() < self.bf16_share else jnp.float32

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def block(self, kind, words, dtype, fn):
        tag = " bf16" if dtype == jnp.bfloat16 else ""
        return Block(kind, words + tag, _in_dtype(dtype, fn))

    # Blocks over the last axis (dense and sequence families).

    def dense(self, shape, width_out=None):
        width = shape[-1]
        width_out = width_out or width
        act_name = self.pick(list(_ACTIVATIONS))
        act, dtype = _ACTIVATIONS[act_name], self.dtype()
        params = {"w": self.normal((width, width_out), width),
                  "b": jnp.zeros((width_out,), jnp.float32)}
        fn = lambda p, h: act(h @ p["w"] + p["b"])
        block = self.block("dense", f"dense {width}->{width_out} {act_name}", dtype, fn)
        rest = math.prod(shape[:-1])
        return block, params, (*shape[:-1], width_out), rest * 2 * width_out

    def residual(self, shape, kind="residual", norm=False):
        width = shape[-1]
        hidden = width * int(self.pick([1, 2, 4]))
        act_name = self.pick(list(_ACTIVATIONS))
        act, dtype = _ACTIVATIONS[act_name], self.dtype()
        params = {"up": self.normal((width, hidden), width),
                  "down": self.normal((hidden, width), 2 * hidden)}
        if norm:    # every parameter is used: no gradient is zero by construction
            params["ln"] = jnp.ones((width,), jnp.float32)

        def fn(p, h):
            z = _layer_norm(h, p["ln"]) if norm else h
            return h + act(z @ p["up"]) @ p["down"]

        words = f"{kind} {width}x{hidden // width} {act_name}" + (" ln" if norm else "")
        rest = math.prod(shape[:-1])
        return (self.block(kind, words, dtype, fn), params, shape,
                rest * (3 * hidden + 3 * width))

    def attention(self, shape):
        seq, width = shape
        heads = int(self.pick([h for h in (1, 2, 4, 8) if width % h == 0 and width // h >= 16]))
        causal = bool(self.rng.random() < 0.5)
        dtype = self.dtype()
        params = {"ln": jnp.ones((width,), jnp.float32),
                  "qkv": self.normal((width, 3 * width), width),
                  "out": self.normal((width, width), width)}
        head_dim = width // heads
        mask = np.tril(np.ones((seq, seq), dtype=bool))

        def fn(p, h):
            batch = h.shape[0]
            q, k, v = jnp.split(_layer_norm(h, p["ln"]) @ p["qkv"], 3, axis=-1)
            split = lambda t: t.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)
            q, k, v = split(q), split(k), split(v)
            scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(head_dim)
            if causal:
                scores = jnp.where(mask, scores, jnp.asarray(-1e4, scores.dtype))
            mixed = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
            return h + mixed.transpose(0, 2, 1, 3).reshape(batch, seq, width) @ p["out"]

        words = (f"attention {heads}h seq{seq} w{width}"
                 + (" causal" if causal else ""))
        return (self.block("attention", words, dtype, fn), params, shape,
                seq * 6 * width + 3 * heads * seq * seq)

    # Blocks over images (NHWC).

    def conv(self, shape, stride=1, channels_out=None):
        size, _, channels = shape
        channels_out = channels_out or channels
        k = int(self.pick([3, 3, 1]))
        dtype = self.dtype()
        params = {"w": self.normal((k, k, channels, channels_out), k * k * channels)}
        fn = lambda p, h: jax.nn.relu(_conv(h, p["w"], stride))
        out = -(-size // stride)
        words = f"conv{k}x{k}/{stride} {channels}->{channels_out} @{size}"
        return (self.block("conv", words, dtype, fn), params, (out, out, channels_out),
                out * out * channels_out * 2)

    def residual_conv(self, shape):
        size, _, channels = shape
        dtype = self.dtype()
        params = {"a": self.normal((3, 3, channels, channels), 9 * channels),
                  "b": self.normal((3, 3, channels, channels), 18 * channels)}
        fn = lambda p, h: h + _conv(jax.nn.relu(_conv(h, p["a"], 1)), p["b"], 1)
        words = f"residual_conv3x3 {channels} @{size}"
        return (self.block("residual_conv", words, dtype, fn), params, shape,
                size * size * channels * 4)

    def pool(self, shape):
        size, _, channels = shape
        op = self.pick(["max", "avg"])
        init, reducer = ((-jnp.inf, jax.lax.max) if op == "max" else (0.0, jax.lax.add))

        def fn(p, h):
            out = jax.lax.reduce_window(h, init, reducer, (1, 2, 2, 1), (1, 2, 2, 1),
                                        "VALID")
            return out if op == "max" else out / 4

        out = size // 2
        return (Block("pool", f"{op}pool2x2 {channels} @{size}", fn), {},
                (out, out, channels), out * out * channels)

    def head(self, shape, width):
        _, _, channels = shape
        dtype = self.dtype()
        params = {"w": self.normal((channels, width), channels),
                  "b": jnp.zeros((width,), jnp.float32)}
        fn = lambda p, h: jnp.tanh(jnp.mean(h, axis=(1, 2)) @ p["w"] + p["b"])
        words = f"head gap+dense {channels}->{width}"
        return self.block("head", words, dtype, fn), params, (width,), 2 * width


# ------------------------------------------------------------------ programs

def _dense_chain(b: _Builder, depth: int):
    shape = (int(b.pick([128, 256, 384, 512])),)
    drawn = []
    for _ in range(depth):
        if b.rng.random() < 0.5:
            drawn.append(b.residual(drawn[-1][2] if drawn else shape,
                                    norm=bool(b.rng.random() < 0.3)))
        else:
            now = drawn[-1][2] if drawn else shape
            drawn.append(b.dense(now, int(b.pick([now[0], now[0], 128, 256, 512]))))
    return shape, drawn


def _sequence_chain(b: _Builder, depth: int):
    shape = (int(b.pick([32, 64, 128])), int(b.pick([64, 128, 256])))
    drawn = []
    for _ in range(depth):
        r = b.rng.random()
        if r < 0.45:
            drawn.append(b.attention(shape))
        elif r < 0.8:
            drawn.append(b.residual(shape, kind="mlp", norm=True))
        else:
            drawn.append(b.dense(shape))
    return shape, drawn


def _image_chain(b: _Builder, depth: int):
    size = int(b.pick([16, 32]))
    shape = start = (size, size, int(b.pick([8, 16, 32])))
    head_at = depth - int(b.rng.integers(1, 3)) if b.rng.random() < 0.5 else depth
    drawn = []
    for i in range(depth):
        if i == head_at:
            block = b.head(shape, int(b.pick([64, 128, 256])))
        elif len(shape) == 1:
            block = b.dense(shape)
        else:
            size, _, channels = shape
            wider = min(2 * channels, 64)
            r = b.rng.random()
            if size >= 8 and r < 0.15:
                block = b.pool(shape)
            elif size >= 8 and r < 0.35:
                block = b.conv(shape, stride=2, channels_out=wider)
            elif r < 0.65:
                block = b.residual_conv(shape)
            else:
                block = b.conv(shape, channels_out=int(b.pick([channels, channels, wider])))
        shape = block[2]
        drawn.append(block)
    return start, drawn


_CHAINS = {"dense": _dense_chain, "sequence": _sequence_chain, "image": _image_chain}
_BATCHES = {"dense": [256, 512, 1024, 2048], "sequence": [4, 8, 16],
            "image": [4, 8, 16]}
_DEPTHS = {"dense": (3, 11), "sequence": (2, 6), "image": (3, 9)}


def random_program(seed: int) -> Program:
    """The random program of ``seed`` (a non-negative int); the same each call.

    >>> random_program(0).description == random_program(0).description
    True
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"random_program: seed must be a non-negative int, got {seed!r}.")
    rng = np.random.default_rng(seed)
    family = FAMILIES[int(rng.integers(len(FAMILIES)))]
    bf16_share = float(rng.choice([0.0, 0.0, 0.3, 0.6]))
    depth = int(rng.integers(*_DEPTHS[family]))
    batch = int(rng.choice(_BATCHES[family]))
    builder = _Builder(rng, bf16_share)
    in_shape, drawn = _CHAINS[family](builder, depth)
    blocks = tuple(d[0] for d in drawn)
    params = tuple(d[1] for d in drawn)
    per_example = sum(d[3] for d in drawn) + math.prod(in_shape)
    low, high = _ACTIVATION_BYTES
    while batch > 2 and 4 * batch * per_example > high:
        batch //= 2
    while 8 * batch * per_example <= high and 4 * batch * per_example < low:
        batch *= 2
    x = jnp.asarray(rng.standard_normal((batch, *in_shape), dtype=np.float32))
    target = jnp.asarray(rng.standard_normal((batch, *drawn[-1][2]), dtype=np.float32))
    words = f"{family} batch {batch} in {'x'.join(map(str, in_shape))}: " + ", ".join(
        blk.description for blk in blocks)
    return Program(f"rp{seed}", seed, family, blocks, params, (x, target), words)


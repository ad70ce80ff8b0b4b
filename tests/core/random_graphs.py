"""Seeded generators of synthetic graphs for the core tests (no JAX)."""

from __future__ import annotations

import random

from remat.core.graph import FUSION_KINDS, Graph, GraphBuilder

#: The kinds a graph has before a compile was read ("copied" comes from one).
GUESSED_KINDS = tuple(k for k in FUSION_KINDS if k != "copied")


def chain(length: int, nbytes: int = 100) -> Graph:
    """x -> op0 -> op1 -> ... -> op{length-1}, every value ``nbytes``."""
    b = GraphBuilder()
    v = b.add_input(nbytes)
    for i in range(length):
        (v,) = b.add_op(f"op{i}", [v], [nbytes])
    return b.build(outputs=[v])


def random_dag(seed: int, num_ops: int = 30, num_inputs: int = 3, max_operands: int = 3,
               fusion: bool = True, window: int | None = None,
               kinds: tuple[str, ...] = GUESSED_KINDS) -> Graph:
    """A random DAG: each op reads 1..max_operands earlier values (inputs or outputs
    of earlier ops, from the last ``window`` ops when given) and defines 1 or 2
    values of random sizes; a few random values are program outputs. Each op's
    fusion kind is drawn from ``kinds`` (repeat one to make it likelier), or is
    "none" without ``fusion``."""
    rng = random.Random(seed)
    b = GraphBuilder()
    values = [b.add_input(rng.randint(1, 1000), donated=rng.random() < 0.2)
              for _ in range(num_inputs)]
    for i in range(num_ops):
        pool = values if window is None else values[-window:]
        operands = rng.sample(pool, k=min(len(pool), rng.randint(1, max_operands)))
        sizes = [rng.choice([0, 4, 64, 512, 4096, rng.randint(1, 10_000)])
                 for _ in range(rng.choice([1, 1, 1, 2]))]
        kind = rng.choice(kinds) if fusion else "none"
        values.extend(b.add_op(f"op{i}", operands, sizes, fusion=kind,
                               flops=rng.randint(0, 100),
                               working_set_bytes=rng.choice([0, 0, 0, 256])))
    produced = values[num_inputs:]
    outputs = rng.sample(produced, k=min(len(produced), rng.randint(1, 3)))
    return b.build(outputs=outputs)


def training_chain(layers: int, act_bytes: int = 1000, weight_bytes: int = 10) -> Graph:
    """The shape of a gradient step of a layer chain: a forward pass saving every
    activation, then a backward pass reading them in reverse; outputs are the
    weight gradients."""
    b = GraphBuilder()
    x = b.add_input(act_bytes)
    weights = [b.add_input(weight_bytes) for _ in range(layers)]
    acts = [x]
    for i in range(layers):
        (a,) = b.add_op("dot", [acts[-1], weights[i]], [act_bytes], flops=100)
        acts.append(a)
    (g,) = b.add_op("reduce_sum", [acts[-1]], [act_bytes], flops=10)
    grads = []
    for i in range(layers, 0, -1):
        (dw,) = b.add_op("dot", [g, acts[i - 1], acts[i]], [weight_bytes], flops=100)
        (g,) = b.add_op("dot", [g, weights[i - 1], acts[i]], [act_bytes], flops=100)
        grads.append(dw)
    return b.build(outputs=grads)


def residual_blocks() -> Graph:
    """A gradient step of two blocks ``h -> h + tanh(norm(h) @ w)``: ops 0-3 and
    4-7 the blocks, 8 the loss, 9-13 and 14-18 their backward passes (tanh_grad,
    the weight's dot, the cotangent's dot, norm_grad, the sum passed on); the
    backward reads no block's input, and its first op is the peak."""
    b = GraphBuilder()
    x, w1, w2 = b.add_input(1000), b.add_input(10), b.add_input(10)

    def block(h, w):
        (n,) = b.add_op("norm", [h], [1000], flops=10)
        (a,) = b.add_op("dot", [n, w], [1000], flops=100)
        (t,) = b.add_op("tanh", [a], [1000], flops=10)
        (out,) = b.add_op("add", [h, t], [1000], flops=10)
        return n, t, out

    n1, t1, h1 = block(x, w1)
    n2, t2, h2 = block(h1, w2)
    (loss,) = b.add_op("reduce_sum", [h2], [4], flops=10)
    grads, g = [], loss
    for n, t, w in ((n2, t2, w2), (n1, t1, w1)):
        (da,) = b.add_op("tanh_grad", [g, t], [3000], flops=10)
        grads += b.add_op("dot", [da, n], [10], flops=100)
        (dn,) = b.add_op("dot", [da, w], [1000], flops=100)
        (dh,) = b.add_op("norm_grad", [dn, n], [1000], flops=10)
        (g,) = b.add_op("add", [dh, g], [1000], flops=10)
    return b.build(outputs=grads)

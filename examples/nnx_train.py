"""Flax NNX: residual blocks with dropout and batch norm checkpointed with
``remat.nnx.remat`` (a drop-in for ``nnx.remat``), trained with optax under
``nnx.jit``; then the whole train step, split into graph and state, planned by
``remat.jit`` under a memory limit.

Run from the repository root: ``python -m examples.nnx_train``.
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import remat
import remat.nnx

WIDTH, DEPTH = 256, 6


class Block(nnx.Module):
    def __init__(self, rngs):
        self.up = nnx.Linear(WIDTH, 2 * WIDTH, rngs=rngs)
        self.down = nnx.Linear(2 * WIDTH, WIDTH, rngs=rngs)
        self.norm = nnx.BatchNorm(WIDTH, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x):
        return x + self.drop(self.down(jax.nn.gelu(self.up(self.norm(x)))))


class Model(nnx.Module):
    def __init__(self, checkpoint, rngs):
        self.blocks = nnx.List([Block(rngs) for _ in range(DEPTH)])
        self.checkpoint = checkpoint

    def __call__(self, x):
        for block in self.blocks:
            x = self.checkpoint(lambda b, x: b(x))(block, x)
        return x


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def temp_mib(checkpoint, x, y):
    """XLA's temporaries of the gradient, in MiB."""
    model = Model(checkpoint, nnx.Rngs(0, dropout=1))
    grad = nnx.jit(nnx.grad(loss_fn))
    return grad.lower(model, x, y).compile().memory_analysis().temp_size_in_bytes / 2**20


def main() -> None:
    x = jax.random.normal(jax.random.key(1), (1024, WIDTH))
    y = jnp.tanh(x)
    for name, checkpoint in (("no checkpoints", lambda f: f), ("nnx.remat", nnx.remat),
                             ("remat.nnx.remat", remat.nnx.remat)):
        print(f"{name}: XLA temp of the gradient {temp_mib(checkpoint, x, y):.1f} MiB")

    model = Model(remat.nnx.remat, nnx.Rngs(0, dropout=1))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)      # the dropout counts moved on, too
        return loss

    for i in range(3):
        print(f"step {i}: loss {float(train_step(model, optimizer, x, y)):.4f}")

    # The whole step under a memory limit: remat.jit takes the state, not the objects.
    plain = Model(lambda f: f, nnx.Rngs(0, dropout=1))
    graphdef, state = nnx.split((plain, nnx.Optimizer(plain, optax.adam(1e-3),
                                                      wrt=nnx.Param)))

    def step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer))

    planned = remat.jit(step, memory_limit=0.5)
    loss, state = planned(state, x, y)
    plan = planned.plan_for(state, x, y)
    print(f"remat plan: {plan.baseline.total / 2**20:.1f} -> "
          f"{plan.planned.total / 2**20:.1f} MiB ({'met' if plan.met else 'missed'})")


if __name__ == "__main__":
    main()

"""Equinox: residual MLP blocks checkpointed with ``remat.equinox.filter_checkpoint``
(a drop-in for ``eqx.filter_checkpoint``), trained with optax under
``eqx.filter_jit``. Each block holds its activation function, a non-array leaf,
which the filter keeps static.

Run from the repository root: ``python -m examples.equinox_train``.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from remat.equinox import filter_checkpoint

WIDTH, DEPTH = 256, 6


class Block(eqx.Module):
    mlp: eqx.nn.MLP

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(WIDTH, WIDTH, 2 * WIDTH, depth=2, activation=jax.nn.gelu,
                              key=key)

    def __call__(self, x):
        return x + jax.vmap(self.mlp)(x)


def make_model(checkpoint):
    keys = jax.random.split(jax.random.key(0), DEPTH)
    return [checkpoint(Block(k)) for k in keys]


def loss_fn(model, x, y):
    for block in model:
        x = block(x)
    return jnp.mean((x - y) ** 2)


def temp_mib(model, x, y):
    """XLA's temporaries of the gradient, in MiB."""
    params, static = eqx.partition(model, eqx.is_array)
    grad = jax.jit(jax.grad(lambda p: loss_fn(eqx.combine(p, static), x, y)))
    return grad.lower(params).compile().memory_analysis().temp_size_in_bytes / 2**20


def main() -> None:
    x = jax.random.normal(jax.random.key(1), (1024, WIDTH))
    y = jnp.tanh(x)
    for name, checkpoint in (("eqx.filter_checkpoint", eqx.filter_checkpoint),
                             ("remat.equinox.filter_checkpoint", filter_checkpoint)):
        print(f"{name}: XLA temp of the gradient "
              f"{temp_mib(make_model(checkpoint), x, y):.1f} MiB")

    model = make_model(filter_checkpoint)
    optimizer = optax.adam(1e-3)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def train_step(model, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, model)
        return eqx.apply_updates(model, updates), opt_state, loss

    for i in range(3):
        model, opt_state, loss = train_step(model, opt_state, x, y)
        print(f"step {i}: loss {float(loss):.4f}")


if __name__ == "__main__":
    main()

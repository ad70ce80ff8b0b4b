"""Haiku: an MLP whose blocks run ``remat.checkpoint`` on their parameters, and an
optax training step compiled by ``remat.jit`` under a memory limit.

Haiku's own ``hk.remat`` calls ``jax.checkpoint``; with ``remat.checkpoint`` a
block fetches its parameters with ``hk.get_parameter`` and checkpoints the pure
computation on them. Run from the repository root: ``python -m examples.haiku_train``.
"""

import haiku as hk
import jax
import jax.numpy as jnp
import optax

import remat

WIDTH = 256


@remat.checkpoint
def _block(w1, w2, x):
    return x + jnp.tanh(jnp.tanh(x @ w1) @ w2)


class Block(hk.Module):
    def __call__(self, x):
        init = hk.initializers.VarianceScaling(0.5)
        w1 = hk.get_parameter("w1", (WIDTH, WIDTH), init=init)
        w2 = hk.get_parameter("w2", (WIDTH, WIDTH), init=init)
        return _block(w1, w2, x)


def forward(x):
    for _ in range(8):
        x = Block()(x)
    return hk.Linear(1)(x)


def main() -> None:
    net = hk.without_apply_rng(hk.transform(forward))
    x = jax.random.normal(jax.random.key(1), (1024, WIDTH))
    y = jnp.cos(x[:, :1])
    params = net.init(jax.random.key(0), x)
    optimizer = optax.sgd(1e-2)
    opt_state = optimizer.init(params)

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((net.apply(p, x) - y) ** 2))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    manual = jax.jit(train_step).lower(params, opt_state, x, y).compile()
    print(f"jax.jit, remat.checkpoint blocks: XLA temp "
          f"{manual.memory_analysis().temp_size_in_bytes / 2**20:.1f} MiB")
    # The automatic pass measures the step as written (fractions are of it, the
    # manual regions included), plans the step without them, and answers with
    # the cheapest that fits: here, a quarter less temporaries.
    step = remat.jit(train_step, memory_limit=0.75)
    print(step.plan_for(params, opt_state, x, y))
    for i in range(3):
        params, opt_state, loss = step(params, opt_state, x, y)
        print(f"step {i}: loss {float(loss):.4f}")


if __name__ == "__main__":
    main()

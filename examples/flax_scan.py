"""Flax linen: residual MLP blocks stacked with ``nn.scan``, each block checkpointed
with ``remat.flax.remat`` (a drop-in for ``nn.remat``), trained with optax, the
whole step compiled by ``remat.jit`` under a memory limit.

Run from the repository root: ``python -m examples.flax_scan``.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import remat
import remat.flax


class Block(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x, _):
        h = nn.Dense(4 * self.width)(nn.LayerNorm()(x))
        return x + nn.Dense(self.width)(nn.gelu(h)), None


class Model(nn.Module):
    width: int = 128
    depth: int = 6

    @nn.compact
    def __call__(self, x):
        # Inside nn.scan the forward and backward loops are apart, so CSE cannot
        # undo the recomputation: prevent_cse=False, as with nn.remat.
        block = remat.flax.remat(Block, prevent_cse=False)
        stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                        length=self.depth)
        x, _ = stack(self.width, name="blocks")(x, None)
        for _ in range(3):    # a wide head outside the scan
            x = nn.gelu(nn.Dense(4 * self.width)(x))
        return nn.Dense(1)(x)


def main() -> None:
    kx, ky, kp = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (1024, 128))
    y = jnp.sin(x.sum(axis=1, keepdims=True))
    model, optimizer = Model(), optax.adam(3e-4)
    params = model.init(kp, x)
    opt_state = optimizer.init(params)

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # The checkpointed blocks already save most of what can be saved here (the
    # step as written includes them), so ask the pass for 90% of the rest; a lower
    # limit it cannot meet raises MemoryLimitError saying the least it reached.
    step = remat.jit(train_step, memory_limit=0.9)
    print(step.plan_for(params, opt_state, x, y))
    for i in range(3):
        params, opt_state, loss = step(params, opt_state, x, y)
        print(f"step {i}: loss {float(loss):.4f}")


if __name__ == "__main__":
    main()

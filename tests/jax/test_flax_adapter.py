"""remat.flax.remat: a drop-in for flax.linen.remat that saves on XLA:CPU what
remat.checkpoint saves, in a Python loop of blocks and inside nn.scan."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

nn = pytest.importorskip("flax.linen")
import remat.flax  # noqa: E402

WIDTH, BATCH, DEPTH = 128, 256, 4


class Block(nn.Module):
    """Three tanh layers and dropout; ``train`` is a Python flag (static)."""
    @nn.compact
    def __call__(self, x, train: bool):
        h = x
        for _ in range(3):
            h = jnp.tanh(nn.Dense(WIDTH)(h))
        h = nn.Dropout(0.1, deterministic=not train)(h)
        return x + h


class ScanBlock(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        h = x
        for _ in range(3):
            h = jnp.tanh(nn.Dense(WIDTH)(h))
        return x + h, None


def _loop_net(wrap):
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            block = Block if wrap is None else wrap(Block, static_argnums=(2,))
            for i in range(DEPTH):
                x = block(name=f"block{i}")(x, True)
            return jnp.mean(x ** 2)
    return Net()


def _scan_net(wrap, **kwargs):
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            block = ScanBlock if wrap is None else wrap(ScanBlock, **kwargs)
            stack = nn.scan(block, variable_axes={"params": 0},
                            split_rngs={"params": True}, length=DEPTH)
            x, _ = stack(name="stack")(x, None)
            return jnp.mean(x ** 2)
    return Net()


def _temp_and_grads(net, params, x):
    rngs = {"dropout": jax.random.key(7)}
    step = jax.jit(jax.grad(lambda p: net.apply(p, x, rngs=rngs)))
    temp = step.lower(params).compile().memory_analysis().temp_size_in_bytes
    return temp, step(params)


def _assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def x():
    return jax.random.normal(jax.random.key(1), (BATCH, WIDTH))


def test_loop_of_blocks_saves_what_nn_remat_does_not(x):
    params = _loop_net(None).init(jax.random.key(0), x)   # explicit names: one tree
    plain_temp, plain_grads = _temp_and_grads(_loop_net(None), params, x)
    flax_temp, _ = _temp_and_grads(_loop_net(nn.remat), params, x)
    ours_temp, ours_grads = _temp_and_grads(_loop_net(remat.flax.remat), params, x)
    assert ours_temp < 0.75 * flax_temp, (ours_temp, flax_temp, plain_temp)
    _assert_same(ours_grads, plain_grads)   # dropout masks included: same RNG streams


@pytest.mark.parametrize("prevent_cse", [True, False])
def test_inside_nn_scan(x, prevent_cse):
    params = _scan_net(None).init(jax.random.key(0), x)
    plain_temp, plain_grads = _temp_and_grads(_scan_net(None), params, x)
    flax_temp, _ = _temp_and_grads(_scan_net(nn.remat, prevent_cse=prevent_cse), params, x)
    ours_temp, ours_grads = _temp_and_grads(
        _scan_net(remat.flax.remat, prevent_cse=prevent_cse), params, x)
    # A scan's forward and backward loops are apart, so nn.remat saves there too;
    # ours saves as much, give or take the buffers its conditional carries.
    assert ours_temp < 0.5 * plain_temp and ours_temp <= 1.1 * flax_temp
    _assert_same(ours_grads, plain_grads)


def test_policy_saves_the_dots(x):
    params = _scan_net(None).init(jax.random.key(0), x)
    none_temp, _ = _temp_and_grads(_scan_net(remat.flax.remat), params, x)
    dots_temp, grads = _temp_and_grads(
        _scan_net(remat.flax.remat, policy=remat.checkpoint_policies.dots_saveable),
        params, x)
    assert dots_temp > none_temp
    _assert_same(grads, _temp_and_grads(_scan_net(None), params, x)[1])


def test_parameter_names_match_nn_remat(x):
    ours = _loop_net(remat.flax.remat).init(jax.random.key(0), x)
    theirs = _loop_net(nn.remat).init(jax.random.key(0), x)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)


def test_mutable_collections_are_updated():
    class Norm(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.BatchNorm(use_running_average=False)(x)

    x = jax.random.normal(jax.random.key(2), (16, 4)) + 3.0
    variables = remat.flax.remat(Norm)().init(jax.random.key(0), x)
    _, updated = remat.flax.remat(Norm)().apply(variables, x, mutable=["batch_stats"])
    _, expected = nn.remat(Norm)().apply(variables, x, mutable=["batch_stats"])
    _assert_same(updated, expected)
    assert not any(np.allclose(u, v) for u, v in zip(
        jax.tree.leaves(updated["batch_stats"]), jax.tree.leaves(variables["batch_stats"])))


def test_docstring_example():
    import remat._jax.flax_adapter as module
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="static_argnums counts `self`"):
        remat.flax.remat(Block, static_argnums=(0,))
    with pytest.raises(TypeError, match="static_argnums must be an int"):
        remat.flax.remat(Block, static_argnums=("train",))
    with pytest.raises(NotImplementedError, match="concrete=True"):
        remat.flax.remat(Block, concrete=True)

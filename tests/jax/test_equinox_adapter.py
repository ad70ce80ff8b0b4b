"""remat.equinox.filter_checkpoint: a drop-in for eqx.filter_checkpoint that saves
on XLA:CPU what remat.checkpoint saves, with non-array leaves kept static."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqx = pytest.importorskip("equinox")
from remat.equinox import filter_checkpoint  # noqa: E402

WIDTH, BATCH, DEPTH = 128, 256, 4


class Block(eqx.Module):
    mlp: eqx.nn.MLP            # holds its activation function: a non-array leaf

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(WIDTH, WIDTH, WIDTH, depth=3, activation=jnp.tanh, key=key)

    def __call__(self, x):
        return x + jax.vmap(self.mlp)(x)


def _blocks():
    return [Block(k) for k in jax.random.split(jax.random.key(0), DEPTH)]


def _loss(blocks, x, wrap):
    for block in blocks:
        x = (block if wrap is None else wrap(block))(x)
    return jnp.mean(x ** 2)


def _temp_and_grads(wrap, blocks, x):
    step = eqx.filter_jit(eqx.filter_grad(lambda b, x: _loss(b, x, wrap)))
    dynamic, static = eqx.partition(blocks, eqx.is_array)
    grad = jax.jit(jax.grad(lambda d, x: _loss(eqx.combine(d, static), x, wrap)))
    temp = grad.lower(dynamic, x).compile().memory_analysis().temp_size_in_bytes
    return temp, step(blocks, x)


def _assert_same(a, b):
    a, b = eqx.filter(a, eqx.is_array), eqx.filter(b, eqx.is_array)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)


def test_saves_what_eqx_filter_checkpoint_does_not():
    blocks, x = _blocks(), jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    plain_temp, plain_grads = _temp_and_grads(None, blocks, x)
    eqx_temp, _ = _temp_and_grads(eqx.filter_checkpoint, blocks, x)
    ours_temp, ours_grads = _temp_and_grads(filter_checkpoint, blocks, x)
    assert ours_temp < 0.75 * eqx_temp, (ours_temp, eqx_temp, plain_temp)
    _assert_same(ours_grads, plain_grads)


def test_stored_in_a_model_its_parameters_get_gradients():
    model = [filter_checkpoint(b) for b in _blocks()]
    x = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    grads = eqx.filter_grad(lambda m, x: _loss(m, x, None))(model, x)
    _assert_same([g.fun for g in grads], eqx.filter_grad(
        lambda b, x: _loss(b, x, None))(_blocks(), x))


def test_method_decorator_static_arguments_and_results():
    class Scaled(eqx.Module):
        w: jax.Array
        act: object = jnp.tanh                     # a function leaf

        @filter_checkpoint(policy=jax.checkpoint_policies.nothing_saveable)
        def __call__(self, x, mode="double"):
            y = self.act(x @ self.w)
            return (2 * y if mode == "double" else y), mode

    m = Scaled(jax.random.normal(jax.random.key(3), (8, 8)))
    x = jax.random.normal(jax.random.key(4), (4, 8))
    out, mode = m(x, mode="single")
    assert mode == "single"                       # a non-array result comes back
    np.testing.assert_allclose(out, jnp.tanh(x @ m.w), rtol=1e-6)
    g = eqx.filter_grad(lambda m: m(x)[0].sum())(m)
    expected = jax.grad(lambda w: (2 * jnp.tanh(x @ w)).sum())(m.w)
    np.testing.assert_allclose(g.w, expected, rtol=1e-6, atol=1e-7)


def test_docstring_example():
    import remat._jax.equinox_adapter as module
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="fun must be callable"):
        filter_checkpoint(3)
    with pytest.raises(TypeError, match="prevent_cse must be a bool"):
        filter_checkpoint(jnp.sin, prevent_cse="yes")

"""remat.nnx.remat: a drop-in for flax.nnx.remat that saves on XLA:CPU what
remat.checkpoint saves and carries module state (RNG counts, batch statistics)
in and out; remat.checkpoint refuses to lose such state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")
import remat  # noqa: E402
import remat.nnx  # noqa: E402

WIDTH, BATCH, DEPTH = 128, 256, 4


class Block(nnx.Module):
    def __init__(self, rngs):
        self.lin = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.norm = nnx.BatchNorm(WIDTH, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)

    def __call__(self, x):
        return x + self.drop(jnp.tanh(self.norm(self.lin(x))))


class Net(nnx.Module):
    def __init__(self, wrap, seed=0):
        rngs = nnx.Rngs(seed, dropout=seed + 1)
        self.blocks = nnx.List([Block(rngs) for _ in range(DEPTH)])
        self.wrap = wrap

    def __call__(self, x):
        for block in self.blocks:
            call = (lambda b, x: b(x)) if self.wrap is None else self.wrap(lambda b, x: b(x))
            x = call(block, x)
        return x


def _x():
    return jax.random.normal(jax.random.key(7), (BATCH, WIDTH))


@nnx.jit
def _grad(net, x):
    return nnx.grad(lambda n: jnp.mean(n(x) ** 2))(net)


def _leaves(tree):
    return [np.asarray(v) for v in jax.tree.leaves(nnx.state(tree, nnx.Param))]


def _batch_stats(net):
    return [np.asarray(v) for v in jax.tree.leaves(nnx.state(net, nnx.BatchStat))]


def test_state_carried_as_without_checkpoints():
    x = _x()
    plain, ours = Net(None), Net(remat.nnx.remat)
    for _ in range(2):      # two steps: the second draws new masks from the counts
        want, got = _grad(plain, x), _grad(ours, x)
        for a, b in zip(_leaves(want), _leaves(got)):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    for a, b in zip(_batch_stats(plain), _batch_stats(ours)):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
    counts = [[int(b.drop.rngs.count[...]) for b in n.blocks] for n in (plain, ours)]
    assert counts[0] == counts[1] and min(counts[1]) > 0, counts


def test_new_dropout_masks_each_step():
    net, x = Net(remat.nnx.remat), _x()
    first, second = _leaves(_grad(net, x)), _leaves(_grad(net, x))
    assert any(not np.allclose(a, b) for a, b in zip(first, second))


class Dense(nnx.Module):
    def __init__(self, rngs):
        self.a = nnx.Linear(WIDTH, WIDTH, rngs=rngs)
        self.b = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x):
        return x + self.b(jnp.tanh(self.a(jnp.tanh(x))))


def _temp(wrap):
    blocks = nnx.List([Dense(nnx.Rngs(k)) for k in range(DEPTH)])
    graphdef, params = nnx.split(blocks)

    def loss(params, x):
        for block in nnx.merge(graphdef, params):
            x = block(x) if wrap is None else wrap(lambda b, x: b(x))(block, x)
        return jnp.mean(x ** 2)

    compiled = jax.jit(jax.grad(loss)).lower(params, _x()).compile()
    return compiled.memory_analysis().temp_size_in_bytes, compiled.cost_analysis()["flops"]


def test_saves_what_nnx_remat_does_not():
    plain_temp, plain_flops = _temp(None)
    nnx_temp, _ = _temp(nnx.remat)
    ours_temp, ours_flops = _temp(remat.nnx.remat)
    assert ours_temp < 0.75 * min(nnx_temp, plain_temp), (ours_temp, nnx_temp, plain_temp)
    assert ours_flops > plain_flops      # the recomputation survived the compiler


def test_static_argnums_and_bound_methods():
    class Scaled(nnx.Module):
        def __init__(self):
            self.lin = nnx.Linear(8, 8, rngs=nnx.Rngs(0))

        def __call__(self, x, power):
            return self.lin(x) ** power

    m, x = Scaled(), jnp.ones((2, 8))
    want = m(x, 2)
    np.testing.assert_allclose(remat.nnx.remat(Scaled.__call__, static_argnums=2)(m, x, 2),
                               want, rtol=1e-6)
    np.testing.assert_allclose(remat.nnx.checkpoint(m.__call__, static_argnums=1)(x, 2),
                               want, rtol=1e-6)
    with pytest.raises(ValueError, match="names argument 3"):
        remat.nnx.remat(Scaled.__call__, static_argnums=3)(m, x, 2)


def test_creating_variables_inside_is_refused():
    class Grows(nnx.Module):
        def __call__(self, x):
            self.seen = nnx.Variable(x)
            return x * 2

    with pytest.raises(ValueError, match="created or deleted NNX variables"):
        remat.nnx.remat(lambda m, x: m(x))(Grows(), jnp.ones(3))


def test_checkpoint_refuses_to_lose_argument_state():
    drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))
    with pytest.raises(ValueError, match=r"changed its arguments \(argument leaf "
                                         r"\[0\]\.rngs\.count.*remat\.nnx\.remat"):
        remat.checkpoint(lambda d, x: d(x))(drop, jnp.ones(4))

    def fills(cache, x):
        cache["y"] = x * 2
        return x

    with pytest.raises(ValueError, match="changed its arguments"):
        remat.checkpoint(fills)({"x": jnp.ones(2)}, jnp.ones(2))


def test_jit_plans_an_nnx_train_step():
    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(WIDTH, WIDTH, rngs=rngs) for _ in range(6)])

        def __call__(self, x):
            for layer in self.layers:
                x = jnp.tanh(layer(x))
            return x

    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    x, y = _x(), jax.random.normal(jax.random.key(8), (BATCH, WIDTH))

    def step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer))

    want = jax.jit(step)(state, x, y)
    planned = remat.jit(step, memory_limit=0.6)
    got = planned(state, x, y)
    assert planned.plan_for(state, x, y).met
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_docstring_example():
    import doctest

    from remat._jax import nnx_adapter

    result = doctest.testmod(nnx_adapter, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="fun must be callable"):
        remat.nnx.remat(3)
    with pytest.raises(TypeError, match="prevent_cse must be a bool"):
        remat.nnx.remat(lambda x: x, prevent_cse=(True,))
    with pytest.raises(TypeError, match="static_argnums must be ints"):
        remat.nnx.remat(lambda x: x, static_argnums=("x",))


def test_jit_refuses_a_step_that_updates_modules_in_place():
    model = nnx.Linear(8, 8, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    def step(model, optimizer, x):     # nnx.jit style: the objects updated in place
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    with pytest.raises(ValueError, match=r"changed its arguments.*nnx\.split"):
        remat.jit(step, memory_limit=0.9)(model, optimizer, jnp.ones((4, 8)))

"""Nested differentiated loops: the inner loops are planned with the outer one,
limits met in XLA's figures, gradients unchanged, at any depth."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat._jax import loop_nest
from remat._jax.compat import core
from remat._jax.inline import inline_calls
from remat._jax.loop_nest import plan_nests, rewrite_nests
from remat.core import loops as core_loops
from remat.core.loops import NestedChoice
from tests.jax.test_loops import _block, _check, _footprint, _transformer_inputs

OUTER, INNER, BATCH, WIDTH = 4, 4, 256, 128


def _layer(c, w):
    return jnp.tanh(jnp.tanh(c @ w) @ w.T) + c, None


def _nested_mlp_loss(ws, x):
    def group(c, wl):
        return jax.lax.scan(_layer, c, wl)[0], None
    return jnp.mean(jax.lax.scan(group, x, ws)[0] ** 2)


def _nested_mlp_inputs(seed, shape=(OUTER, INNER)):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return (jax.random.normal(k1, (*shape, WIDTH, WIDTH)) / np.sqrt(WIDTH),
            jax.random.normal(k2, (BATCH, WIDTH)))


def _forward_flops(ws):
    """The FLOPs of the forward pass's matmuls: two per layer."""
    return ws.size // (WIDTH * WIDTH) * 2 * 2 * BATCH * WIDTH * WIDTH


def _inner_decisions(plan):
    return [d for d in plan.loops if d.within is not None]


@pytest.mark.parametrize("fraction", [0.5, 0.3])
def test_nested_scanned_mlp(fraction):
    ws, x = _nested_mlp_inputs(1)
    plan = _check(jax.value_and_grad(_nested_mlp_loss), (ws, x), fraction)
    inner = _inner_decisions(plan)
    assert len(plan.loops) == 2 and len(inner) == 1
    assert inner[0].runs == OUTER and inner[0].length == INNER
    assert "inside the loop at" in str(plan)
    if fraction == 0.5:
        # Rebuilding inside the inner loop costs well below running it again whole
        # (the only way to rebuild its stacks when it is one op of the outer body).
        assert plan.extra_flops < 0.75 * _forward_flops(ws)


@pytest.mark.parametrize("fraction", [0.5, 0.3])
def test_nested_scanned_transformer(fraction):
    params, x = _transformer_inputs(2, layers=6)
    grouped = jax.tree.map(lambda p: p.reshape(2, 3, *p.shape[1:]), params)

    def loss(params, x):
        def group(c, p):
            return jax.lax.scan(_block, c, p)[0], None
        return jnp.mean(jax.lax.scan(group, x, params)[0] ** 2)

    plan = _check(jax.value_and_grad(loss), (grouped, x), fraction)
    assert _inner_decisions(plan)
    if fraction == 0.5:
        # Well below running the inner loops' forward again (their six matmuls
        # per block, 12 d^2 weights, over every token).
        batch, seq, width = x.shape
        assert plan.extra_flops < 0.5 * 6 * 2 * batch * seq * 12 * width ** 2


def test_fori_loop_inside_a_scanned_layer():
    ws, x = _nested_mlp_inputs(3, shape=(OUTER,))

    def loss(ws, x):
        def layer(c, w):
            step = lambda i, h: jnp.tanh(h @ w) * (1.0 + 0.01 * i) + h
            return jax.lax.fori_loop(0, INNER, step, c), None
        return jnp.mean(jax.lax.scan(layer, x, ws)[0] ** 2)

    plan = _check(jax.grad(loss), (ws, x), 0.3)
    assert _inner_decisions(plan)


def test_every_nested_choice_gives_the_plain_gradient():
    ws, x = _nested_mlp_inputs(4)
    flat = inline_calls(jax.make_jaxpr(jax.grad(_nested_mlp_loss, argnums=(0, 1)))(ws, x))
    nests = plan_nests(flat.jaxpr)
    assert len(nests) == 1 and len(nests[0].inner) == 1 and len(nests[0].variants) > 1
    front = nests[0].frontier
    assert all(isinstance(c, NestedChoice) for c in front)
    assert len({c.variant for c in front}) > 1       # inner choices take part
    want = core.jaxpr_as_fun(flat)(ws, x)
    sizes = []
    for choice in front:
        closed = core.ClosedJaxpr(rewrite_nests(flat.jaxpr, nests, [choice]), flat.consts)
        compiled = jax.jit(core.jaxpr_as_fun(closed)).lower(ws, x).compile()
        sizes.append(_footprint(compiled))
        for got, w in zip(compiled(ws, x), want):
            np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)
    # What the model frees, XLA frees too: memory falls along the frontier, and
    # its last choice stacks at least four of each layer's six residuals fewer.
    assert all(a > b for a, b in zip(sizes, sizes[1:]))
    assert sizes[0] - sizes[-1] >= OUTER * INNER * 4 * BATCH * WIDTH * 4


def test_three_levels_compose():
    ws, x = _nested_mlp_inputs(5, shape=(2, 3, 4))

    def loss(ws, x):
        def middle(c, wl):
            return jax.lax.scan(_layer, c, wl)[0], None

        def outer(c, wl):
            return jax.lax.scan(middle, c, wl)[0], None
        return jnp.mean(jax.lax.scan(outer, x, ws)[0] ** 2)

    flat = inline_calls(jax.make_jaxpr(jax.grad(loss))(ws, x))
    nests = plan_nests(flat.jaxpr)
    assert [n.length for n in nests] == [2]
    assert [n.length for n in nests[0].inner] == [3]
    assert [n.length for n in nests[0].inner[0].inner] == [4]
    plan = _check(jax.grad(loss), (ws, x), 0.3)
    assert {d.runs for d in plan.loops} == {1, 2, 6}


def test_flax_scan_of_scans_meets_thirty_percent():
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            return x + nn.Dense(64)(jnp.tanh(nn.Dense(128)(x))), None

    class Group(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            stack = nn.scan(Block, variable_axes={"params": 0},
                            split_rngs={"params": True}, length=3)
            return stack(name="blocks")(x, None)[0], None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            stack = nn.scan(Group, variable_axes={"params": 0},
                            split_rngs={"params": True}, length=4)
            return jnp.sum(stack(name="groups")(x, None)[0] ** 2)

    x = jax.random.normal(jax.random.key(1), (256, 64))
    model = Model()
    params = model.init(jax.random.key(0), x)
    plan = _check(jax.grad(lambda p, x: model.apply(p, x)), (params, x), 0.3)
    assert "test_loop_nest.py" in _inner_decisions(plan)[0].source


@pytest.mark.parametrize("module", [loop_nest, core_loops])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0

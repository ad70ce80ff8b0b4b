"""The ``"gate"`` lowering serves every region the conditional serves.

Each test compiles a program under ``lowering="gate"`` and checks the structure
(no control flow where the gate applies, the conditional where it falls back), the
memory against the conditional (XLA's figure) and the gradients against the plain
program.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat

ON_CPU = jax.default_backend() == "cpu"
gate = functools.partial(remat.checkpoint, lowering="gate")
cond = functools.partial(remat.checkpoint, lowering="cond")


def _dense(w, x):
    return jnp.tanh(jnp.tanh(x @ w) @ w.T) + x


def _chain(wrap, layers=8, residual=True, **kwargs):
    dense = _dense if residual else lambda w, x: jnp.tanh(jnp.tanh(x @ w) @ w.T)

    def loss(ws, x):
        for i in range(0, layers, 2):
            x = wrap(lambda ws, x: dense(ws[1], dense(ws[0], x)), **kwargs)(
                ws[i:i + 2], x)
        return jnp.mean(jnp.sin(x))
    return loss


def _chain_args(seed=0, layers=8, batch=256, width=128):
    keys = jax.random.split(jax.random.key(seed), layers + 1)
    ws = [jax.random.normal(k, (width, width)) / np.sqrt(width) for k in keys[:-1]]
    return ws, jax.random.normal(keys[-1], (batch, width))


def _compile(loss, *args):
    return jax.jit(jax.grad(loss)).lower(*args).compile()


def _temp(compiled):
    return compiled.memory_analysis().temp_size_in_bytes


def _close(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


def _lowered(loss, *args):
    return jax.jit(jax.grad(loss)).lower(*args).as_text()


@pytest.mark.parametrize("policy", [
    None, remat.checkpoint_policies.dots_with_no_batch_dims_saveable,
    remat.checkpoint_policies.save_only_these_names("none")],
    ids=["nothing", "dots_no_batch", "names"])
@pytest.mark.parametrize("residual", [False, True])
def test_policies_with_saved_values(policy, residual):
    args = _chain_args()
    plain = _compile(_chain(lambda f, **_: f, residual=residual), *args)
    ours = _compile(_chain(gate, residual=residual, policy=policy), *args)
    theirs = _compile(_chain(cond, residual=residual, policy=policy), *args)
    assert "conditional(" not in ours.as_text()
    assert ours.cost_analysis()["flops"] > plain.cost_analysis()["flops"]
    if ON_CPU:
        # On the residual chain, XLA fuses the loss's cotangent into each of its
        # readers and so holds the two forward values it is made of, where the
        # conditional's operand held the one cotangent: one activation more.
        activation = args[1].nbytes
        slack = activation if residual else 0
        assert _temp(ours) <= _temp(theirs) + slack
        if policy is None:      # saving the dots' outputs saves no memory here
            assert _temp(ours) < _temp(plain)
    _close(ours(*_chain_args(1)), plain(*_chain_args(1)))


def test_nested_regions():
    def outer(ws, x):
        for w in ws:
            x = gate(_dense)(w, x)
        return x

    def loss_of(wrap_outer):
        def loss(ws, x):
            for i in range(0, 8, 4):
                x = wrap_outer(outer)(ws[i:i + 4], x)
            return jnp.mean(jnp.sin(x))
        return loss

    args = _chain_args()
    ours = _compile(loss_of(gate), *args)
    assert "conditional(" not in ours.as_text()
    assert "rng" in _lowered(loss_of(gate), *args)
    _close(ours(*args), jax.grad(_chain(lambda f, **_: f))(*args))


def test_every_cotangent_gates_the_recomputation():
    # Two outputs with cotangents: one element of each is read into the gate.
    def two(w, x):
        h = _dense(w, x)
        return h, jnp.tanh(h @ w)

    def loss_of(wrap):
        def loss(w, x):
            a, b = wrap(two)(w, x)
            return jnp.mean(a ** 2) + jnp.mean(jnp.sin(b))
        return loss

    ws, x = _chain_args()
    text = _lowered(loss_of(gate), ws[0], x)
    assert "stablehlo.if" not in text and "stablehlo.rng" in text
    assert text.count("stablehlo.slice") >= 2
    _close(jax.jit(jax.grad(loss_of(gate)))(ws[0], x),
           jax.grad(loss_of(lambda f: f))(ws[0], x))


def test_a_nan_cotangent_does_not_flip_the_gate():
    # The gate is 0 whatever the cotangent holds: NaN and Inf flow through the
    # backward pass exactly as without remat.
    def loss_of(wrap):
        def loss(w, x, c):
            return jnp.sum(wrap(_dense)(w, x) * c)
        return loss

    ws, x = _chain_args()
    c = jnp.ones_like(x).at[0, 0].set(jnp.nan).at[1, 1].set(jnp.inf)
    got = jax.jit(jax.grad(loss_of(gate), (0, 1)))(ws[0], x, c)
    want = jax.jit(jax.grad(loss_of(lambda f: f), (0, 1)))(ws[0], x, c)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_integer_and_empty_outputs():
    # An integer output has no cotangent (float0) and an empty one has nothing to
    # read; the float output's cotangent gates the region.
    def f(w, x):
        h = _dense(w, x)
        return h, jnp.argmax(h, axis=1), h[:0] * 2.0

    def loss_of(wrap):
        def loss(w, x):
            h, idx, empty = wrap(f)(w, x)
            return jnp.mean(h ** 2) + jnp.sum(idx) * 0.0 + jnp.sum(empty)
        return loss

    ws, x = _chain_args()
    text = _lowered(loss_of(gate), ws[0], x)
    assert "stablehlo.if" not in text and "stablehlo.rng" in text
    _close(jax.jit(jax.grad(loss_of(gate)))(ws[0], x),
           jax.grad(loss_of(lambda f: f))(ws[0], x))


def test_only_an_empty_cotangent_falls_back_to_the_conditional():
    def f(w, x):
        return jnp.tanh(x @ w)[:0]

    loss = lambda w, x: jnp.sum(gate(f)(w, x)) + jnp.sum(x @ w)
    ws, x = _chain_args()
    assert "stablehlo.if" in _lowered(loss, ws[0], x)
    _close(jax.jit(jax.grad(loss))(ws[0], x),
           jax.grad(lambda w, x: jnp.sum(f(w, x)) + jnp.sum(x @ w))(ws[0], x))


def test_a_bfloat16_cotangent_gates_without_a_conditional():
    # bfloat16 is not a numpy number type; its cotangents gate all the same
    ws, x = _chain_args()
    ws = [w.astype(jnp.bfloat16) for w in ws]
    x = x.astype(jnp.bfloat16)
    loss = lambda w, x: jnp.sum(gate(lambda w, x: jnp.tanh(x @ w))(w, x).astype(jnp.float32))
    assert "stablehlo.if" not in _lowered(loss, ws[0], x)
    want = jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w).astype(jnp.float32)))(ws[0], x)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(loss))(ws[0], x), np.float32),
                                  np.asarray(want, np.float32))


def test_a_region_without_cotangents_falls_back_to_the_conditional():
    # jax.linearize's tangent program runs the recomputing region forward: it
    # has no cotangent to wait for, so the conditional protects it.
    ws, x = _chain_args()
    f = lambda x: gate(_dense)(ws[0], x)
    _, f_jvp = jax.linearize(f, x)
    assert "stablehlo.if" in jax.jit(f_jvp).lower(x).as_text()
    _, want = jax.jvp(lambda x: _dense(ws[0], x), (x,), (x,))
    np.testing.assert_allclose(jax.jit(f_jvp)(x), want, rtol=1e-5, atol=1e-6)


def _conv_chain(ws, x):
    for w in ws:
        x = jnp.tanh(jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
    return jnp.sum(x ** 2)


def _conv_args(seed=0, layers=6):
    keys = jax.random.split(jax.random.key(seed), layers + 1)
    ws = [jax.random.normal(k, (3, 3, 16, 16)) / 12 for k in keys[:-1]]
    return ws, jax.random.normal(keys[-1], (16, 16, 16, 16))


@pytest.mark.skipif(not ON_CPU, reason="XLA:CPU's default lowering picks per region")
def test_regions_gated_by_default_where_they_read_convolutions():
    # By default a region is gated where it reads convolutions (a conditional would
    # run them on XLA:CPU's slow generic kernel) and a conditional elsewhere: the
    # automatic pass's plan of the conv chain, checkpoints by hand on the dense
    # one. (The conv chain's backward convolutions reading late already meet 0.7.)
    plan = remat.plan(jax.grad(_conv_chain), *_conv_args(), memory_limit=0.4,
                      small_node_limit=0)
    assert plan.met and plan.result.regions
    dense = _chain(remat.checkpoint)
    for compiled, loss, make in [(plan.compiled, _conv_chain, _conv_args),
                                 (_compile(dense, *_chain_args()), dense, _chain_args)]:
        text = compiled.as_text()
        assert ("conditional(" in text) == (loss is dense) and "rng" in text
        _close(compiled(*make(1)), _compile(loss, *make())(*make(1)))
    assert plan.extra_flops > 0


def test_the_bit_generator_runs_once_however_many_regions_are_gated():
    # XLA copies cheap elementwise producers into every fusion that reads them; the
    # opaque value comes out of a reduction (never fused into its readers), so its
    # bit generator is compiled once, not once per gated input (its xor
    # instructions: 144 for one region and 1152 for eight, before).
    def generator_instructions(layers):
        text = _compile(_chain(gate, layers=layers), *_chain_args(layers=layers)).as_text()
        return text.count(" xor(")

    one, many = generator_instructions(2), generator_instructions(16)
    assert 0 < many == one

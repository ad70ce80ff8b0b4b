"""inline.py: flattening a program, and merging the computations it repeats."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from remat._jax.compat import core
from remat._jax.inline import has_regions, inline_calls


def _segments(wrap):
    """``_chain`` in two checkpointed segments of two layers."""
    segment = wrap(_layers)

    def loss(ws, x):
        return jnp.sum(segment(ws[2:], segment(ws[:2], x)) ** 2)
    return loss


def _layers(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return x


def _args():
    r = np.random.default_rng(0)
    return ([jnp.asarray(r.normal(size=(16, 16)), jnp.float32) for _ in range(4)],
            jnp.asarray(r.normal(size=(8, 16)), jnp.float32))


def _primitives(closed):
    return sorted(e.primitive.name for e in closed.jaxpr.eqns)


@pytest.mark.parametrize("wrap", [jax.checkpoint, remat.checkpoint,
                                  lambda f: jax.checkpoint(f, prevent_cse=False)],
                         ids=["jax", "remat", "jax-no-prevent-cse"])
def test_a_checkpoint_dissolves_into_the_program_without_it(wrap):
    """Inlined, a checkpoint's recomputation is the forward pass again: merged,
    the flat gradient computes what the unwrapped one does."""
    args = _args()
    plain = jax.make_jaxpr(jax.value_and_grad(_segments(lambda f: f)))(*args)
    wrapped = jax.make_jaxpr(jax.value_and_grad(_segments(wrap)))(*args)
    assert has_regions(wrapped.jaxpr) and not has_regions(plain.jaxpr)
    assert _primitives(inline_calls(wrapped)) == _primitives(inline_calls(plain))


def _repeats(x):
    a, b = jnp.sin(x) * 2.0, jnp.sin(x) * 2.0      # one computation
    c = jnp.sin(x) * 3.0                           # another literal
    return a + b + c


def test_merging_in_a_region_keeps_values_and_distinguishes_literals():
    flat = inline_calls(jax.make_jaxpr(jax.checkpoint(_repeats))(1.0))
    assert _primitives(flat) == ["add", "add", "mul", "mul", "sin"]
    x = np.float32(0.7)
    np.testing.assert_allclose(core.jaxpr_as_fun(flat)(x)[0], _repeats(x), rtol=1e-6)


def test_outside_regions_equations_are_kept_as_written():
    flat = inline_calls(jax.make_jaxpr(_repeats)(1.0))
    assert _primitives(flat).count("sin") == 3


def test_effects_and_stateful_randomness_are_never_merged():
    @jax.checkpoint
    def f(x):
        u = jax.lax.rng_uniform(0.0, 1.0, (3,)) + jax.lax.rng_uniform(0.0, 1.0, (3,))
        jax.debug.print("{}", x)
        jax.debug.print("{}", x)
        return u * x
    names = _primitives(inline_calls(jax.make_jaxpr(f)(1.0)))
    assert names.count("rng_uniform") == 2 and names.count("debug_print") == 2


def test_a_cond_with_a_constant_index_is_its_branch():
    # JAX folds a predicate it can decide into a literal index (optax.MultiSteps'
    # skip test); XLA then inlines the branch, and so does the flat program.
    def step(x, y):
        z = jax.lax.cond(jnp.array(False), lambda a, b: a * b, lambda a, b: a - b, x, y)
        return jax.lax.cond(x.sum() > 0, jnp.sin, jnp.cos, z)    # decided at run time
    x, y = jnp.arange(3.0), jnp.ones(3)
    flat = inline_calls(jax.make_jaxpr(step)(x, y))
    assert _primitives(flat).count("cond") == 1 and "sub" in _primitives(flat)
    assert "mul" not in _primitives(flat)
    np.testing.assert_allclose(core.jaxpr_as_fun(flat)(x, y)[0], step(x, y))


def test_a_switch_on_a_constant_index_is_its_branch_and_loops_are_not_run():
    def step(x):
        y = jax.lax.switch(jnp.array(7), [jnp.sin, jnp.cos, lambda v: v * 3], x)  # clamped
        n = jax.lax.fori_loop(0, 3, lambda i, c: c + i, 0)    # constants, left to XLA
        return y + n
    flat = inline_calls(jax.make_jaxpr(step)(1.0))
    names = _primitives(flat)
    assert "cond" not in names and "clamp" not in names and "sin" not in names
    assert any(n in ("while", "scan") for n in names)
    np.testing.assert_allclose(core.jaxpr_as_fun(flat)(2.0)[0], step(2.0))


def test_a_key_made_from_a_constant_is_left_to_the_compiler():
    # jax.random.key(0) inside the step (Flax's initialize_carry makes one) is an
    # equation of literals whose result no NumPy array holds: not folded
    def step(ws, x):
        noise = jax.random.normal(jax.random.key(0), x.shape)
        return jax.grad(lambda ws: jnp.sum(_layers(ws, x + noise) ** 2))(ws)
    ws, x = _args()
    x = jnp.tile(x, (256, 8))
    ws = [jnp.tile(w, (8, 8)) / 8 for w in ws]
    flat = inline_calls(jax.make_jaxpr(step)(ws, x))
    for a, b in zip(core.jaxpr_as_fun(flat)(*ws, x), step(ws, x)):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    plan = remat.plan(step, ws, x, memory_limit=0.9)
    assert plan.extra_flops > 0
    for a, b in zip(plan.compiled(ws, x), jax.jit(step)(ws, x)):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_optax_multisteps_update_has_no_conditional_left():
    # Its skip test is a constant False: the update is one branch, planned through.
    optax = pytest.importorskip("optax")
    tx = optax.MultiSteps(optax.adam(1e-3), 2)
    params = {"w": jnp.ones((4, 4))}

    def update(grads, state):
        return tx.update(grads, state, params)
    traced = jax.make_jaxpr(update)(params, tx.init(params))
    assert any(e.primitive.name == "cond" for e in traced.jaxpr.eqns)
    assert "cond" not in _primitives(inline_calls(traced))


def test_a_float_scalar_of_constants_is_left_to_the_compiler():
    # A mean's 1 / n: folding would run it eagerly (a compile of its own on the
    # first call); XLA folds it as well. Integer scalars (an index) are folded.
    def f(x):
        return jnp.mean(x) + jnp.float32(2.0) * jnp.float32(3.0)
    flat = inline_calls(jax.make_jaxpr(f)(jnp.ones(4)))
    assert "div" in _primitives(flat) and "mul" in _primitives(flat)
    np.testing.assert_allclose(core.jaxpr_as_fun(flat)(jnp.ones(4))[0], 7.0)


def test_a_sharding_annotation_of_a_scalar_constant_is_the_constant():
    # jax.jit with shardings annotates a gradient's seed (reshard 1.0); kept,
    # the planner would count it as communication in each region reading it
    from jax.sharding import NamedSharding, PartitionSpec
    replicated = NamedSharding(jax.make_mesh((1,), ("d",)), PartitionSpec())
    f = lambda x: jax.lax.with_sharding_constraint(1.0, replicated) - x
    flat = inline_calls(jax.make_jaxpr(f)(jnp.ones(3)))
    assert "sharding_constraint" not in _primitives(flat)
    np.testing.assert_allclose(core.jaxpr_as_fun(flat)(jnp.full(3, 0.25))[0], 0.75)

"""remat.jit inside a loop that is not differentiated (gradient accumulation over
microbatches): the body is planned, the whole program measured."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from remat._jax.loop_body import BodyPlan
from remat._jax.planner import forget_planners
from remat._jax.xla_figures import XlaFootprint

WIDTH, DEPTH, BATCH, MICRO = 256, 8, 256, 3


def _loss(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.mean(x ** 2)


def _scanned_loss(ws, x):          # the layers under lax.scan: a differentiated loop
    x, _ = jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x, ws)
    return jnp.mean(x ** 2)


def _accumulating(loss):
    def step(ws, xs):
        def body(g, x):
            return jax.tree.map(jnp.add, g, jax.grad(loss)(ws, x)), None
        g, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, ws), xs)
        return g
    return step


def _inputs(stacked):
    keys = jax.random.split(jax.random.key(0), DEPTH)
    ws = [jax.random.normal(k, (WIDTH, WIDTH)) / WIDTH ** 0.5 for k in keys]
    xs = jax.random.normal(jax.random.key(1), (MICRO, BATCH, WIDTH))
    return (jnp.stack(ws) if stacked else ws), xs


def _assert_same(want, got):
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("loss, stacked", [(_loss, False), (_scanned_loss, True)])
def test_a_limit_is_met_inside_the_accumulation_loop(loss, stacked):
    forget_planners()
    step, (ws, xs) = _accumulating(loss), _inputs(stacked)
    planned = remat.jit(step, memory_limit=0.6)
    got = planned(ws, xs)
    _assert_same(jax.jit(step)(ws, xs), got)
    plan = planned.plan_for(ws, xs)
    assert isinstance(plan, BodyPlan) and plan.met, plan
    assert f"({MICRO} iterations, not differentiated)" in str(plan)
    assert plan.extra_flops > 0
    if stacked:     # the layers' loop inside the body, planned as a loop
        assert plan.loops and "iterations" in str(plan.loops[0])
    # the whole rewritten program, lowered again, is what was measured
    again = XlaFootprint.of(planned.lower(ws, xs).compile())
    assert again.total == plan.planned.total <= plan.limit_bytes


def test_a_refusal_says_what_each_search_reached():
    forget_planners()
    step, (ws, xs) = _accumulating(_loss), _inputs(False)
    plain = XlaFootprint.of(jax.jit(step).lower(ws, xs).compile())
    with pytest.raises(remat.MemoryLimitError) as info:
        remat.plan(step, ws, xs, memory_limit=plain.held_whatever + 1024)
    e = info.value
    assert e.least_bytes < plain.total      # the body's plans went lower
    assert f"{e.least_bytes} bytes" in str(e)
    assert "planning inside the loop at" in str(e) and "planning around it" in str(e)


def test_accumulation_loops_inside_one_another():
    # groups of microbatches: the inner loop's body is planned, run 2 x 3 times
    forget_planners()
    ws, _ = _inputs(False)
    xss = jax.random.normal(jax.random.key(2), (2, 3, BATCH, WIDTH))
    inner = _accumulating(_loss)

    def step(ws, xss):
        def group(g, xs):
            return jax.tree.map(jnp.add, g, inner(ws, xs)), None
        return jax.lax.scan(group, jax.tree.map(jnp.zeros_like, ws), xss)[0]

    plan = remat.plan(step, ws, xss, memory_limit=0.8)
    assert isinstance(plan, BodyPlan) and plan.met and plan.iterations == 6, plan
    _assert_same(jax.jit(step)(ws, xss), plan.compiled(ws, xss))

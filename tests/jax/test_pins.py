"""Backward convolutions read their saved operands late (``remat/_jax/pins.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from remat._jax.call import CallSpec
from remat._jax.compat import core
from remat._jax.pins import pin_late_reads
from remat._jax.planner import forget_planners, planner_for
from remat._jax.program import trace_program
from remat._jax.xla_figures import XlaFootprint
from remat.core.options import resolve_options

ON_CPU = jax.default_backend() == "cpu"


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _loss(ws, x):
    for w in ws:
        x = jax.nn.relu(_conv(x, w))
    return jnp.mean(x ** 2)


def _args(seed, layers=4, size=16, channels=16):
    keys = jax.random.split(jax.random.PRNGKey(seed), layers + 1)
    ws = [jax.random.normal(k, (3, 3, channels, channels)) * 0.2 for k in keys[:-1]]
    return ws, jax.random.normal(keys[-1], (8, size, size, channels))


def _programs(fun, args):
    program, _ = trace_program(fun, args, {}, CallSpec(), {})
    flat = program.flat
    return program, flat, core.ClosedJaxpr(pin_late_reads(flat.jaxpr), flat.consts)


def test_only_convolutions_reading_an_earlier_operand_are_pinned():
    _, flat, pinned = _programs(jax.value_and_grad(_loss), _args(0))
    convs = [e for e in flat.jaxpr.eqns if e.primitive.name == "conv_general_dilated"]
    regions = [e for e in pinned.jaxpr.eqns if e.primitive.name == "remat"]
    # 4 forward convolutions (weights and activations independent: not pinned),
    # 4 weight gradients and 3 input gradients (the first layer's is not needed)
    assert len(convs) == 11
    assert len(regions) == 4     # the weight gradients: conv(activation, cotangent)
    for r in regions:
        assert r.params["lowering"] == "gate" and r.params["num_late"] == 1
        assert r.params["prevent_cse"] == (True, False)
        [inner] = r.params["jaxpr"].eqns
        assert inner.primitive.name == "conv_general_dilated"


@pytest.mark.parametrize("seed", [1, 2])
def test_reading_late_computes_the_same_gradients(seed):
    args = _args(seed)
    program, flat, pinned = _programs(jax.value_and_grad(_loss), args)
    leaves = jax.tree.leaves(args)
    want = program.compile(flat)(*leaves)
    got = program.compile(pinned)(*leaves)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        assert np.abs(np.asarray(a)).max() > 0
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.skipif(not ON_CPU, reason="XLA:CPU's layout copies")
def test_reading_late_lowers_xlas_footprint_of_a_conv_net():
    program, flat, pinned = _programs(jax.value_and_grad(_loss), _args(0, layers=6))
    plain = XlaFootprint.of(program.compile(flat, measure_only=True))
    late = XlaFootprint.of(program.compile(pinned, measure_only=True))
    activation = 8 * 16 * 16 * 16 * 4
    # each saved activation's transposed copy is no longer held across the forward
    assert late.total <= plain.total - 2 * activation


@pytest.mark.skipif(not ON_CPU, reason="XLA:CPU's layout copies")
def test_a_limit_the_plain_program_read_late_meets_is_met_without_recompute():
    forget_planners()
    args = _args(3, layers=6)
    fun = jax.value_and_grad(_loss)
    program, flat, pinned = _programs(fun, args)
    plain = XlaFootprint.of(program.compile(flat, measure_only=True)).total
    late = XlaFootprint.of(program.compile(pinned, measure_only=True)).total
    assert late < plain
    p = remat.plan(fun, *args, memory_limit=(plain + late) // 2)
    assert p.met and p.extra_flops == 0 and p.planned.total == late
    assert p.algorithm == "plain, reading late"
    limited = remat.jit(fun, memory_limit=(plain + late) // 2)
    for a, b in zip(jax.tree.leaves(jax.jit(fun)(*args)), jax.tree.leaves(limited(*args))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def _mlp_loss(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


def test_matrix_products_are_left_as_written():
    ws = [jnp.eye(32) * 0.5] * 3
    _, flat, pinned = _programs(jax.value_and_grad(_mlp_loss), (ws, jnp.ones((8, 32))))
    assert pinned.jaxpr is flat.jaxpr


@pytest.mark.skipif(not ON_CPU, reason="XLA:CPU's layout copies")
def test_plans_read_late_only_where_xla_reads_the_plain_program_lower():
    # the plain program reading late is compiled once, at the first limit below
    # the plain program; plans read late only if XLA reads it lower
    forget_planners()
    # XLA:CPU reads the conv net lower reading late; the MLP has nothing to read
    # late (and no compile to decide it)
    for fun, args, lower in [(jax.value_and_grad(_loss), _args(5, layers=6), True),
                             (jax.value_and_grad(_mlp_loss),
                              ([jnp.eye(256) * 0.5] * 6, jnp.ones((512, 256))), False)]:
        program, flat, pinned = _programs(fun, args)
        late = XlaFootprint.of(program.compile(pinned, measure_only=True)).total
        planner = planner_for(program, resolve_options({"memory_limit": 0.9}, {}))
        assert not planner.reads_late
        planner.answer(planner.baseline.total - 1)
        assert (late < planner.baseline.total) == lower
        assert planner.reads_late == lower
        assert planner.compiles - planner.frontier.compiles == (1 if lower else 0)
        assert planner.reference.total == min(late, planner.baseline.total)

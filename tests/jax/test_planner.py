"""planner.py: the columns of the default portfolio and of each algorithm."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat._jax.call import CallSpec
from remat._jax.planner import Planner
from remat._jax.portfolio import OPTIMAL_MAX_OPS, PORTFOLIO_ALGORITHMS
from remat._jax.program import trace_program
from remat.core.options import resolve_options


def _program():
    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x ** 2)
    r = np.random.default_rng(0)
    args = ([jnp.asarray(r.normal(size=(32, 32)), jnp.float32) for _ in range(4)],
            jnp.asarray(r.normal(size=(16, 32)), jnp.float32))
    step = jax.value_and_grad(loss)
    return trace_program(step, args, {}, CallSpec.of(step, {}), {})[0]


def _columns(program, **settings):
    return {c.name for c in _frontier_columns(program, **settings)}


def _frontier_columns(program, **settings):
    options = resolve_options({"memory_limit": 0.5, **settings}, {})
    return Planner(program, options).frontier.columns


@pytest.mark.parametrize("algorithm", PORTFOLIO_ALGORITHMS)
def test_the_default_plans_every_column_a_chosen_algorithm_plans(algorithm):
    """The frontier meets what any of its columns meets (``core.search``), so the
    default refuses no limit an algorithm chosen alone meets when its columns
    (each order, each lowering) are among the default's."""
    program = _program()
    assert program.graph.num_ops <= OPTIMAL_MAX_OPS
    default = _columns(program)
    chosen = _columns(program, algorithm=algorithm)
    assert chosen <= default
    assert {name.split("/")[0].split(" ")[0] for name in default} == set(PORTFOLIO_ALGORITHMS)


def test_the_planner_plans_again_on_the_ops_as_xla_fused_them():
    # a gelu MLP's gradient: the model guesses the bias adds stored (each is read
    # by several fusions); XLA computes them again inside each. Once the plain
    # program is compiled, the first order is planned on again as XLA fused it,
    # its simulated peak nearer XLA's, in a frontier asked where the first refuses
    def loss(params, x):
        for w, b in params:
            x = jax.nn.gelu(x @ w + b)
        return jnp.sum(x ** 2)
    r = np.random.default_rng(1)
    args = ([(jnp.asarray(r.normal(size=(64, 64)) / 8, jnp.float32),
              jnp.asarray(r.normal(size=64), jnp.float32)) for _ in range(4)],
            jnp.asarray(r.normal(size=(256, 64)), jnp.float32))
    step = jax.grad(loss)
    program = trace_program(step, args, {}, CallSpec.of(step, {}), {})[0]
    planner = Planner(program, resolve_options({"memory_limit": 0.5}, {}))
    orders = len(planner.orders)
    assert planner.fused is None                 # (made when a limit needs it)
    frontier = planner._fused_frontier()
    assert len(planner.orders) == orders + 1
    guessed, fused = planner.orders[0], planner.orders[-1]
    assert fused.schedule == guessed.schedule and fused.graph is not program.graph
    assert {op.fusion for op in fused.graph.ops} >= {"copied"}
    xla = planner.plain.total
    assert (abs(fused.timeline.peak_bytes / xla - 1)
            < abs(guessed.timeline.peak_bytes / xla - 1))
    assert not any("as XLA fused" in c.name for c in planner.frontier.columns)
    assert all(c.name.endswith("/order 0, as XLA fused") for c in frontier.columns)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's two lowerings")
def test_each_column_has_its_plans_under_the_other_lowering():
    # the dense program's regions go in a conditional by default: each column of
    # the first order is followed by its plans gated; a conv program's the other
    # way round (the default gates regions that read convolutions). The other
    # orders' columns under the other lowering come next, as last resorts; then
    # segments' plans realized whole, on every order, under both lowerings
    def conv_loss(ws, x):
        for w in ws:
            x = jnp.tanh(jax.lax.conv(x, w, (1, 1), "SAME"))
        return jnp.sum(x ** 2)
    r = np.random.default_rng(2)
    args = ([jnp.asarray(r.normal(size=(4, 4, 3, 3)) / 6, jnp.float32) for _ in range(3)],
            jnp.asarray(r.normal(size=(2, 4, 16, 16)), jnp.float32))
    step = jax.value_and_grad(conv_loss)
    conv = trace_program(step, args, {}, CallSpec.of(step, {}), {})[0]
    for program, other in [(_program(), "gate"), (conv, "cond")]:
        columns = _frontier_columns(program)
        whole = [c for c in columns if "(whole)" in c.name]
        segments = [c.name for c in columns if c.name.startswith("segments/")
                    and not c.name.endswith(")")]
        assert segments and sorted(c.name for c in whole) == sorted(
            f"{n} (whole){lowering}" for n in segments for lowering in ("", f" ({other})"))
        assert columns[-len(whole):] == tuple(whole) and all(c.last_resort for c in whole)
        columns = columns[:-len(whole)]
        names = [c.name for c in columns]
        first = sorted(n for n in names if n.endswith("/order 0"))
        assert first and sorted(n for n in names if n.endswith(f"/order 0 ({other})")) == [
            f"{n} ({other})" for n in first]
        later = [c for c in columns if c.name.endswith(")") and "order 0" not in c.name]
        assert later and columns[-len(later):] == tuple(later)
        assert sorted(c.name for c in later) == sorted(
            f"{n} ({other})" for n in names if "order 0" not in n
            and not n.endswith(")") and not n.startswith("optimal"))
        assert all(c.last_resort for c in later) and not any(
            c.last_resort for c in columns[:-len(later)])

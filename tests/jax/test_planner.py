"""planner.py: the columns of the default portfolio and of each algorithm."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat._jax.planner import OPTIMAL_MAX_OPS, PORTFOLIO_ALGORITHMS, Planner
from remat._jax.program import CallSpec, trace_program
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
    options = resolve_options({"memory_limit": 0.5, **settings}, {})
    return {c.name for c in Planner(program, options).frontier.columns}


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

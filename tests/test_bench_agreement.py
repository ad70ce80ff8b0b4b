"""bench.bench_agreement: the model's bytes against XLA's, plan by plan."""

import math

import jax
import jax.numpy as jnp

from bench import bench_agreement


def _chain(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


def test_every_compiled_plan_gets_an_error_against_the_plain_programs_scale():
    # A chain of dots and tanh: the model reads the plain program as XLA does
    # (nothing fuses across a layer), so its scale is 1; the plans the search
    # compiled (at 80%, 50%, 30%) each get an error, and at least one reads as
    # the model says (at these small sizes others read up to ~15% apart, where
    # XLA's schedule holds one activation more than the model's).
    ws = [jnp.eye(128) * 0.9] * 8
    plain, errors = bench_agreement.plan_errors(jax.grad(_chain),
                                                (ws, jnp.ones((1024, 128))))
    assert abs(plain - 1) < 0.01
    assert len(errors) >= 3 and all(math.isfinite(e) and e >= 0 for e in errors)
    assert min(errors) < 0.01

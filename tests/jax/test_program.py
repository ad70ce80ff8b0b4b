"""program.py: tracing a call into a Program, and compiling its rewrites."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat._jax.program import MEASURE_OPTIONS, CallSpec, trace_program
from remat._jax.xla_figures import XlaFootprint


def _mlp(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


def _conv(w, x):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(y)
    y = jax.lax.conv_general_dilated(y, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.mean(y ** 2)


def _scanned(w, x):
    def body(h, _):
        return jnp.sin(h @ w), None
    return jnp.sum(jax.lax.scan(body, x, None, length=6)[0])


def _args(name):
    r = np.random.default_rng(0)
    if name == "mlp":
        return _mlp, ([jnp.asarray(r.normal(size=(256, 256)), jnp.float32)] * 4,
                      jnp.asarray(r.normal(size=(512, 256)), jnp.float32))
    if name == "conv":
        return _conv, (jnp.asarray(r.normal(size=(3, 3, 16, 16)), jnp.float32),
                       jnp.asarray(r.normal(size=(4, 32, 32, 16)), jnp.float32))
    return _scanned, (jnp.asarray(r.normal(size=(128, 128)), jnp.float32),
                      jnp.asarray(r.normal(size=(64, 128)), jnp.float32))


@pytest.mark.skipif(jax.default_backend() not in MEASURE_OPTIONS,
                    reason="no measuring options on this platform")
@pytest.mark.parametrize("name", ["mlp", "conv", "scan"])
def test_a_measuring_compile_reads_the_memory_of_a_full_one(name):
    fun, args = _args(name)
    grad = jax.value_and_grad(fun)
    program, _ = trace_program(grad, args, {}, CallSpec.of(grad, {}), {})
    fast = XlaFootprint.of(program.compile(program.flat, measure_only=True))
    full = XlaFootprint.of(program.compile(program.flat))
    assert fast == full


def test_the_platform_is_the_default_backend_without_shardings():
    program, _ = trace_program(_mlp, _args("mlp")[1], {}, CallSpec.of(_mlp, {}), {})
    assert program.platform() == jax.default_backend()

"""Regions in a scan body: the loop keeps the passes apart, so no protection is paid.

Differentiating a ``lax.scan`` puts a region's forward in one loop and its
recomputation in another; ``remat.checkpoint`` then costs what ``jax.checkpoint``
costs there, whatever the policy. Where the passes can meet (an unrolled scan, a
gradient taken inside the body), the protection stays.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from bench.bench_lowering import scanned_transformer
from remat._jax.scan_passes import loop_separates

POLICIES = {"nothing": None,
            "dots_no_batch": remat.checkpoint_policies.dots_with_no_batch_dims_saveable,
            "dots": remat.checkpoint_policies.dots_saveable}
SMALL = dict(layers=4, batch=4, seq=64, width=128, heads=4)


def _prevent_cse_flags(fun, *args):
    """The ``prevent_cse`` of every differentiated remat equation in ``fun``'s jaxpr."""
    text = str(jax.make_jaxpr(fun)(*args))
    return [m.group(1) for m in re.finditer(
        r"remat\[[^\]]*?differentiated=True[^\]]*?prevent_cse=(\w+)", text, re.S)] + [
        m.group(1) for m in re.finditer(
            r"remat\[[^\]]*?prevent_cse=(\w+)[^\]]*?differentiated=True", text, re.S)]


def _temp(loss, args):
    compiled = jax.jit(jax.grad(loss)).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("lowering", [None, "cond"])
@pytest.mark.parametrize("policy", list(POLICIES.values()), ids=list(POLICIES))
def test_scan_body_costs_what_jax_checkpoint_costs(policy, lowering):
    args = scanned_transformer(lambda f: f, **SMALL)[1]
    ours = scanned_transformer(
        functools.partial(remat.checkpoint, policy=policy, lowering=lowering), **SMALL)[0]
    theirs = scanned_transformer(functools.partial(jax.checkpoint, policy=policy),
                                 **SMALL)[0]
    if jax.default_backend() == "cpu":     # XLA:CPU drops jax.checkpoint's barrier
        assert _temp(ours, args) <= _temp(theirs, args)
    assert set(_prevent_cse_flags(jax.grad(ours), *args)) == {"False"}
    got, want = jax.jit(jax.grad(ours))(*args), jax.grad(theirs)(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def _scanned(wrap, **scan_kwargs):
    def loss(ws, x):
        body = wrap(lambda h, w: (jnp.tanh(jnp.tanh(h @ w) @ w.T) + h, None))
        h, _ = jax.lax.scan(body, x, ws, **scan_kwargs)
        return jnp.mean(jnp.sin(h))
    return loss


def _scan_args(layers=4):
    k1, k2 = jax.random.split(jax.random.key(0))
    return jax.random.normal(k1, (layers, 32, 32)) / 6, jax.random.normal(k2, (8, 32))


@pytest.mark.parametrize("scan_kwargs,separated", [
    (dict(), True), (dict(unroll=2), True), (dict(unroll=True), False),
    (dict(unroll=3), False)], ids=["loop", "unroll2", "unrolled", "remainder"])
def test_protection_only_where_the_loop_separates(scan_kwargs, separated):
    args = _scan_args()
    loss = _scanned(remat.checkpoint, **scan_kwargs)
    flags = set(_prevent_cse_flags(jax.grad(loss), *args))
    assert flags == ({"False"} if separated else {"True"})
    got = jax.jit(jax.grad(loss))(*args)
    np.testing.assert_allclose(got, jax.grad(_scanned(lambda f: f))(*args),
                               rtol=1e-5, atol=1e-7)


def test_loop_separates():
    assert loop_separates(dict(length=8, unroll=1))
    assert loop_separates(dict(length=8, unroll=4))
    assert not loop_separates(dict(length=1, unroll=1))      # XLA removes the loop
    assert not loop_separates(dict(length=8, unroll=8))      # straight-line code
    assert not loop_separates(dict(length=8, unroll=3))      # two trips left outside
    assert not loop_separates(dict(length=8, unroll=0))


def test_gradient_inside_the_body_keeps_its_protection():
    # Forward and backward of the inner gradient share one loop body: the
    # recomputation there must still be protected.
    def body(h, w):
        g = jax.grad(lambda h: jnp.sum(remat.checkpoint(
            lambda h: jnp.tanh(jnp.tanh(h @ w) @ w.T))(h)))(h)
        return h - 0.1 * g, None

    ws, x = _scan_args()
    loss = lambda ws, x: jnp.sum(jnp.sin(jax.lax.scan(body, x, ws)[0]))
    assert "True" in set(_prevent_cse_flags(jax.grad(loss), ws, x))


def test_jaxpr_level_split_of_a_scan():
    # jax.checkpoint around the scan splits the body with the jaxpr-level rules.
    args = _scan_args()
    inner = _scanned(remat.checkpoint)
    loss = jax.checkpoint(inner)
    assert set(_prevent_cse_flags(jax.grad(loss), *args)) == {"False"}
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(*args),
                               jax.grad(_scanned(lambda f: f))(*args),
                               rtol=1e-5, atol=1e-7)


def test_docstring_examples():
    import doctest
    from remat._jax import scan_passes as loops
    result = doctest.testmod(loops)
    assert result.failed == 0 and result.attempted > 0

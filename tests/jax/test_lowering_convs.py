"""Regions whose backward holds convolutions keep XLA:CPU's fast kernels.

XLA:CPU runs backward convolutions inside a conditional's branch with a slow
generic kernel (measured 25-40x slower), so the ``"cond"`` lowering splits such
regions: the recomputation stays in the gated conditional, the backward runs
outside it. These tests check the structure, not the speed (timings are noise).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _block(w, x):
    for _ in range(3):
        x = jnp.tanh(_conv(x, w))
    return x


def _loss(wrap):
    def loss(w, x):
        for _ in range(2):
            x = wrap(_block)(w, x)
        return jnp.mean(x ** 2)
    return loss


def _computations(hlo_text):
    """Name -> body text of each computation of an optimized HLO module."""
    bodies, name = {}, None
    for line in hlo_text.splitlines():
        head = re.match(r"(?:ENTRY )?%?([\w.\-]+) \(", line)
        if head and not line.startswith(" "):
            name = head.group(1)
            bodies[name] = []
        elif name is not None:
            bodies[name].append(line)
    return {n: "\n".join(b) for n, b in bodies.items()}


def _branch_text(hlo_text):
    """Everything the conditionals' branches run, called computations included."""
    bodies = _computations(hlo_text)
    todo = [n for line in hlo_text.splitlines() if " conditional(" in line
            for n in re.findall(r"(?:true_computation|false_computation|"
                                r"branch_computations)=\{?%?([\w.\-]+)", line)]
    todo += [n for line in hlo_text.splitlines() if " conditional(" in line
             for group in re.findall(r"branch_computations=\{([^}]*)\}", line)
             for n in re.findall(r"%?([\w.\-]+)", group)]
    seen = set()
    while todo:
        n = todo.pop()
        if n in seen or n not in bodies:
            continue
        seen.add(n)
        todo += re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", bodies[n])
    return "\n".join(bodies[n] for n in seen)


def _conditional_results(hlo_text):
    """The result types of the conditionals in an optimized HLO module."""
    return [line.split("=", 1)[1].split("conditional(")[0]
            for line in hlo_text.splitlines() if " conditional(" in line]


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="the gated conditional is XLA:CPU's default lowering")
def test_backward_convolutions_run_outside_the_conditional():
    k1, k2 = jax.random.split(jax.random.key(0))
    w = jax.random.normal(k1, (3, 3, 8, 8)) * 0.2
    x = jax.random.normal(k2, (4, 16, 16, 8))
    compiled = jax.jit(jax.grad(_loss(remat.checkpoint))).lower(w, x).compile()
    text = compiled.as_text()
    branches = _branch_text(text)
    assert "conditional(" in text and branches
    # The weight-gradient convolutions (a 16x16 window over the activations) are
    # outside the branches; the recomputation's forward convolutions are inside.
    assert "window={size=16x16" in text and "window={size=16x16" not in branches
    assert "window={size=3x3" in branches or "ynn" in branches
    plain = jax.jit(jax.grad(_loss(lambda f: f)))(w, x)
    np.testing.assert_allclose(compiled(w, x), plain, rtol=1e-5, atol=1e-7)


def test_dense_regions_stay_whole():
    w = jnp.eye(16) * 0.5
    x = jnp.ones((8, 16))
    dense = lambda w, x: jnp.tanh(jnp.tanh(x @ w) @ w)
    loss = lambda w, x: jnp.sum(remat.checkpoint(dense, lowering="cond")(w, x) ** 2)
    results = _conditional_results(jax.jit(jax.grad(loss)).lower(w, x).compile().as_text())
    # The whole backward is inside: the conditional returns the weight gradient.
    assert results and all("f32[16,16]" in r for r in results)


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="the gated conditional is XLA:CPU's default lowering")
def test_a_split_region_waits_for_every_cotangent():
    # Two outputs, two cotangents: the recomputation may not run before either
    # exists, so the conditional's predicate reads both (a NaN check on each).
    def two(w, x):
        y = _block(w, x)
        return y, jnp.tanh(_conv(y, w))

    def loss_of(wrap):
        def loss(w, x):
            a, b = wrap(two)(w, x)
            return jnp.mean(a ** 2) + jnp.mean(jnp.sin(b))
        return loss

    loss = loss_of(remat.checkpoint)

    k1, k2 = jax.random.split(jax.random.key(1))
    w = jax.random.normal(k1, (3, 3, 8, 8)) * 0.2
    x = jax.random.normal(k2, (4, 16, 16, 8))
    text = jax.jit(jax.grad(loss)).lower(w, x).as_text()
    assert "stablehlo.if" in text
    assert len(re.findall(r"stablehlo.compare\s+NE", text)) == 2
    plain = jax.jit(jax.grad(loss_of(lambda f: f)))(w, x)
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(w, x), plain, rtol=1e-5, atol=1e-7)

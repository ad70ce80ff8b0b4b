"""Regions whose backward holds convolutions keep XLA:CPU's fast kernels.

XLA:CPU runs convolutions inside a conditional's branch with a slow generic kernel
(measured 25-40x slower). The default ``"gate"`` lowering puts no control flow
around a region at all; the ``"cond"`` lowering splits such regions: the
recomputation stays in the gated conditional, the backward runs outside it.
These tests check the structure, not the speed (timings are noise).
"""

import functools
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


ON_CPU = jax.default_backend() == "cpu"
_cond = functools.partial(remat.checkpoint, lowering="cond")


@pytest.mark.skipif(not ON_CPU, reason="XLA:CPU's kernels and HLO names")
def test_backward_convolutions_run_outside_the_conditional():
    k1, k2 = jax.random.split(jax.random.key(0))
    w = jax.random.normal(k1, (3, 3, 8, 8)) * 0.2
    x = jax.random.normal(k2, (4, 16, 16, 8))
    compiled = jax.jit(jax.grad(_loss(_cond))).lower(w, x).compile()
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

    loss = loss_of(_cond)

    k1, k2 = jax.random.split(jax.random.key(1))
    w = jax.random.normal(k1, (3, 3, 8, 8)) * 0.2
    x = jax.random.normal(k2, (4, 16, 16, 8))
    text = jax.jit(jax.grad(loss)).lower(w, x).as_text()
    assert "stablehlo.if" in text
    assert len(re.findall(r"stablehlo.compare\s+NE", text)) == 2
    plain = jax.jit(jax.grad(loss_of(lambda f: f)))(w, x)
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(w, x), plain, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------- the "gate" lowering

def _layouts():
    """Convolutions as users write them: ``conv(w, x)`` for each layout."""
    def nhwc(w, x, stride=1, groups=1):
        return jax.lax.conv_general_dilated(
            x, w, (stride, stride), "SAME", feature_group_count=groups,
            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def nchw_vmapped(w, x):       # one example at a time, as Equinox does
        one = lambda x: jax.lax.conv_general_dilated(
            x[None], jnp.transpose(w, (3, 2, 0, 1)), (1, 1), "SAME",
            dimension_numbers=("NCHW", "OIHW", "NCHW"))[0]
        return jax.vmap(one)(jnp.transpose(x, (0, 3, 1, 2))).transpose(0, 2, 3, 1)

    return {
        "nhwc": nhwc,
        "nchw_vmapped": nchw_vmapped,
        "grouped": lambda w, x: nhwc(w[:, :, :4], x, groups=2),
        "strided": lambda w, x: jax.image.resize(nhwc(w, x, stride=2), x.shape, "nearest"),
    }


def _conv_loss(conv, wrap):
    def block(w, x):
        for _ in range(3):
            x = jnp.tanh(conv(w, x)) + x
        return x

    def loss(w, x):
        for _ in range(2):
            x = wrap(block)(w, x)
        return jnp.mean(jnp.sin(x))
    return loss


@pytest.fixture(scope="module")
def conv_args():
    k1, k2 = jax.random.split(jax.random.key(2))
    return jax.random.normal(k1, (3, 3, 8, 8)) * 0.2, jax.random.normal(k2, (4, 16, 16, 8))


def _count(text, op):
    return len(re.findall(rf"\s{op}\(", text))


@pytest.mark.parametrize("layout", list(_layouts()))
def test_gated_convolutions_have_no_control_flow_and_are_recomputed(layout, conv_args):
    w, x = conv_args
    conv = _layouts()[layout]
    step = lambda wrap: jax.jit(jax.grad(_conv_loss(conv, wrap))).lower(w, x).compile()
    plain, cond, gate = step(lambda f: f), step(_cond), step(
        functools.partial(remat.checkpoint, lowering="gate"))
    text = gate.as_text()
    assert _count(text, "conditional") == _count(text, "while") == 0
    if ON_CPU:
        # Every convolution runs in the entry computation (none in a branch), and
        # the gate recomputes exactly what the conditional does: nothing merged.
        entry = text[text.index("\nENTRY"):]
        assert _count(entry, "convolution") == _count(text, "convolution")
        assert _count(text, "convolution") == _count(cond.as_text(), "convolution")
        assert _count(text, "convolution") > _count(plain.as_text(), "convolution")
    temp = lambda c: c.memory_analysis().temp_size_in_bytes
    assert temp(gate) < temp(plain)
    if ON_CPU:
        assert temp(gate) <= temp(cond)
    np.testing.assert_allclose(gate(w, x), plain(w, x), rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(not ON_CPU, reason="the order is XLA:CPU's schedule")
def test_gated_recomputation_runs_after_the_cotangent(conv_args):
    # The scheduled entry computation runs in order. The forward convolutions all
    # come first (nothing recomputed was hoisted into the forward pass), and the
    # first block's recomputation, gated on its cotangent, only starts after the
    # second block's backward convolutions (which produce that cotangent).
    w, x = conv_args
    loss = _conv_loss(_layouts()["nhwc"], remat.checkpoint)
    text = jax.jit(jax.grad(loss)).lower(w, x).compile().as_text()
    entry = text[text.index("ENTRY"):].splitlines()
    convs = [i for i, line in enumerate(entry) if " convolution(" in line]
    forward = [i for i in convs if '/jvp()/' in entry[i]]
    assert len(forward) == 6 and forward == convs[:6]
    gates = [i for i, line in enumerate(entry) if " fusion(" in line and
             "/remat\"" in line and "select" in line]
    first_region, second_region = gates[:len(gates) // 2], gates[len(gates) // 2:]
    assert first_region and second_region
    between = [i for i in convs if first_region[-1] < i < second_region[0]]
    assert len(between) >= 3 + 5       # recomputed forward, then the backward

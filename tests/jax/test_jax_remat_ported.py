"""JAX's own remat tests (``RematTest`` in tests/api_test.py and the remat cases of
tests/lax_control_flow_test.py), rewritten as pytest functions that run against
``remat.checkpoint`` instead of ``jax.checkpoint``.

Left out, because they test JAX internals that ``remat`` does not share:

- jaxpr text and parameters specific to JAX's implementation (the ``remat2`` /
  ``checkpoint`` primitive name, ``f_lin.func.args[0]`` closure layout, the
  ``concrete=True`` keyword of the long-removed old remat): the equivalent
  checks below inspect ``make_jaxpr`` of the linearized/VJP function instead.
- the second half of ``test_remat_eval_counter``, built on ``jax.core.call`` /
  ``jax.linear_util``, which no longer exist in jax 0.10.
- ``test_linearize_caching`` / ``test_vjp_caching``: they count JAX's own C++
  jit cache misses through ``jax._src.test_util`` hooks.
- ``test_escaped_tracer_remat``: jax 0.10.2's own ``jax.checkpoint`` caches the
  trace too and no longer raises there; remat behaves the same.
- ``test_remat_jit_static_argnum_omnistaging``: it tests ``core.call_p`` under
  ``jax.jit``, not remat.
- the offloading tests (``test_remat_scan_jaxpr_offloadable`` and friends): they
  need a multi-device mesh and read compiled host-memory statistics; the
  offloading policies are exercised in test_policies.py instead.

Deliberate difference: ``jax.checkpoint`` lets a *concrete* tracer (e.g. from an
outer ``jax.grad``) be passed at a static position; ``remat.checkpoint`` rejects
every tracer there (see test_checkpoint_errors.py), so the ported
``..._static_argnums`` tests differentiate with respect to a non-static argument.
"""

from __future__ import annotations

import contextlib
import logging
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jex_core
from jax.interpreters import ad
from jax.interpreters import partial_eval as pe
from jax.test_util import check_grads

import remat
from remat import checkpoint_name, saved_residuals

HIGHEST = lax.Precision.HIGHEST

# The variants every basic test runs under: JAX parameterizes the same way over
# its old and new implementations and a policy that saves nothing. (remat.remat
# is checked to be the same function in test_remat_alias.)
VARIANTS = {
    "default": remat.checkpoint,
    "policy": partial(remat.checkpoint, policy=lambda *_, **__: False),
    "no_cse": partial(remat.checkpoint, prevent_cse=False),
}
variants = pytest.mark.parametrize("ckpt", list(VARIANTS.values()),
                                   ids=list(VARIANTS))


def close(a, b, rtol=1e-6, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


@contextlib.contextmanager
def counting_impl(prim, calls: list):
    """Counts eager evaluations of ``prim`` while active."""
    impl = prim.impl
    prim.def_impl(lambda *a, **p: calls.append(1) or impl(*a, **p))
    try:
        yield
    finally:
        prim.def_impl(impl)


@variants
def test_remat_basic(ckpt):
    @ckpt
    def g(x):
        return lax.sin(lax.sin(x)), 3.

    def f(x):
        x, _ = g(x)
        return x

    close(f(2.), np.sin(np.sin(2.)))
    ans, f_lin = jax.linearize(f, 2.)
    close(ans, np.sin(np.sin(2.)))
    close(f_lin(3.), np.cos(np.sin(2.)) * np.cos(2.) * 3.)

    sin_calls, cos_calls = [], []
    with counting_impl(lax.sin_p, sin_calls), counting_impl(lax.cos_p, cos_calls):
        f_lin(3.)
    # The linear function recomputes sin(2.) once and needs two cosines.
    assert len(sin_calls) == 1
    assert len(cos_calls) == 2


def test_remat_alias():
    f = lambda x: jnp.sin(jnp.sin(x))
    g = remat.remat(f, policy=remat.checkpoint_policies.dots_saveable,
                    prevent_cse=False, lowering="while")
    close(jax.jit(jax.grad(g))(2.), jax.grad(f)(2.))
    assert g.__wrapped__ is f


@variants
def test_remat_freevars(ckpt):
    def f1(x):
        y = 2 * jnp.sin(x)
        return jnp.cos(x) * jnp.sin(y)

    def f2(x):
        y = 2 * jnp.sin(x)
        return ckpt(lambda x: jnp.cos(x) * jnp.sin(y))(x)

    ans, f_lin = jax.linearize(f2, 2.)
    expected, f_lin_expected = jax.linearize(f1, 2.)
    close(ans, expected)
    close(f_lin(3.), f_lin_expected(3.))


def test_remat_concrete_error():
    @remat.checkpoint  # no static_argnums
    def g(x):
        if x > 0:
            return lax.sin(x)
        return lax.cos(x)

    with pytest.raises(jax.errors.ConcretizationTypeError, match="static_argnums"):
        g(3.)

    @partial(remat.checkpoint, static_argnums=(1,))
    def g2(x, y):
        if y > 0:   # fine: y is static
            return lax.sin(x)
        if x > 0:   # not fine: x is not
            return lax.cos(x)
        return x

    close(g2(3., 1), np.sin(3.))
    with pytest.raises(jax.errors.ConcretizationTypeError, match="static_argnums"):
        g2(3., -1)


@variants
def test_remat_grad_python_control_flow_static_argnums(ckpt):
    @partial(ckpt, static_argnums=(0,))
    def g(flag, x):
        if flag > 0:
            return lax.sin(x), 3.
        return lax.cos(x), 4.

    def f(x, flag=2.):
        x, _ = g(flag, x)
        return x

    close(f(2.), np.sin(2.))
    close(jax.grad(f)(2.), np.cos(2.))
    close(jax.grad(f)(2., -1.), -np.sin(2.))


@variants
def test_remat_grad_python_control_flow_unhashable_static_argnums(ckpt):
    class A:
        def __init__(self, val):
            self.val = val

        def __hash__(self):
            raise TypeError("unhashable")

    @partial(ckpt, static_argnums=(0,))
    def g(a, x):
        if a.val > 0:
            return lax.sin(x), 3.
        return lax.cos(x), 4.

    def f(x):
        x, _ = g(A(1.), x)
        return x

    close(f(2.), np.sin(2.))
    close(jax.grad(f)(2.), np.cos(2.))


@variants
def test_remat_retracing(ckpt):
    count = 0

    @ckpt
    def g(x):
        nonlocal count
        count += 1
        return lax.sin(x), 3.

    def f(x):
        x, _ = g(x)
        return x

    for _ in range(10):
        f(2.).block_until_ready()
    assert count == 1


@variants
def test_remat_static_argnums_retracing(ckpt):
    count = 0

    @partial(ckpt, static_argnums=(1,))
    def g(x, y):
        nonlocal count
        count += 1
        return lax.sin(x) if y else lax.cos(x), 3.

    def f(x, y):
        x, _ = g(x, y)
        return x

    for _ in range(10):
        f(2., True).block_until_ready()
    assert count == 1
    f(2., False)
    assert count == 2


@variants
def test_remat_jit(ckpt):
    @ckpt
    def g(x):
        return lax.sin(lax.sin(x))

    def f_(x):
        return g(x)
    f = jax.jit(f_)

    expected = np.cos(np.sin(2.)) * np.cos(2.)
    close(f(2.), np.sin(np.sin(2.)))
    close(jax.grad(f)(2.), expected)
    close(jax.jit(jax.grad(f_))(2.), expected)


@variants
def test_remat_vmap(ckpt):
    @ckpt
    def g(x):
        return lax.sin(lax.sin(x))

    x = np.arange(3.)
    close(jax.vmap(g)(x), np.sin(np.sin(x)))
    jac = np.diag(np.cos(np.sin(x)) * np.cos(x))
    close(jax.jacfwd(g)(x), jac)
    close(jax.jacrev(g)(x), jac)


@variants
def test_remat_vmap_not_leading_dim(ckpt):
    @ckpt
    def g(x):
        return lax.sin(lax.sin(x))

    x = np.arange(3 * 5.).reshape(3, 5)
    close(jax.vmap(g, 1, 0)(x), np.sin(np.sin(x)).T)


@variants
def test_remat_higher_order_autodiff(ckpt):
    def f(x):
        return lax.cos(lax.sin(x))
    g = ckpt(f)
    close(jax.grad(jax.grad(g))(3.), jax.grad(jax.grad(f))(3.))


@variants
def test_remat_scan(ckpt):
    to_scan = lambda c, x: (jnp.sin(c), None)

    def f_noremat(x):
        y, _ = lax.scan(to_scan, x, np.arange(3.))
        return y

    def f_yesremat(x):
        y, _ = lax.scan(ckpt(to_scan), x, np.arange(3.))
        return y

    close(f_yesremat(4.), f_noremat(4.))
    close(jax.grad(f_yesremat)(4.), jax.grad(f_noremat)(4.))

    # The cosines are computed in the linear / backward function, inside the scan.
    jaxpr = jax.make_jaxpr(jax.linearize(f_yesremat, 4.)[1])(1.)
    scan_eqn, = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    assert " cos " in str(scan_eqn.params["jaxpr"])

    jaxpr = jax.make_jaxpr(jax.vjp(f_yesremat, 4.)[1])(1.)
    assert " cos " in str(jaxpr)


@variants
def test_remat_no_redundant_flops(ckpt):
    @jax.jit
    def g(x):
        return f(2., x)

    @ckpt
    def f(x, y):
        return jnp.sin(x) * y

    called = []
    with counting_impl(lax.sin_p, called):
        jax.grad(g)(3.)
    assert len(called) <= 1


@variants
def test_remat_binomial_checkpointing(ckpt):
    def binom_checkpoint(funs):
        if len(funs) == 1:
            return funs[0]
        f1 = binom_checkpoint(funs[:len(funs) // 2])
        f2 = binom_checkpoint(funs[len(funs) // 2:])
        return ckpt(lambda x: f1(f2(x)))

    f1 = binom_checkpoint([jnp.sin, jnp.sin, jnp.sin, jnp.sin])
    f2 = lambda x: jnp.sin(jnp.sin(jnp.sin(jnp.sin(x))))
    close(f1(4.), f2(4.))
    close(jax.grad(f1)(4.), jax.grad(f2)(4.))


@variants
def test_remat_symbolic_zeros(ckpt):
    # The scanned body ignores the integer xs and one output has no tangent.
    key = jax.random.PRNGKey(0)
    r_init = jax.random.uniform(key, (5, 3), minval=0.0, maxval=5.0)

    def func(d0):
        def move(r, i):
            return r + 0.001 * (d0 * r), jnp.array([0.])
        r, _ = lax.scan(ckpt(move), r_init, jnp.arange(2))
        return r[0, 0]

    expected = jax.grad(lambda d0: (r_init * (1 + 0.001 * d0) ** 2)[0, 0])(5.0)
    close(jax.grad(func)(5.0), expected, rtol=1e-5)


@variants
def test_remat_jit2(ckpt):
    @jax.jit
    def f(x):
        y = 2 * x

        @ckpt
        def g():
            return y

        return g()

    close(f(3), 6)


@variants
def test_remat_nontrivial_env(ckpt):
    @ckpt
    def foo(state, dt=0.5, c=1):
        u, u_t = state
        u_tt = c ** 2 * u
        u_t = u_t + u_tt * dt
        return (u, u_t)

    @partial(jax.jit, static_argnums=(1,))
    def _multi_step(state, count, dt, c):
        f = lambda s, _: (foo(s, dt, c), _)
        return lax.scan(f, state, None, count)

    def multi_step(state, count, dt=1 / jnp.sqrt(2), c=1):
        return _multi_step(state, count, dt, c)

    def loss(u0, target, steps, dt=1 / jnp.sqrt(2), c=1):
        init = (u0, jnp.zeros_like(u0))
        (uf, _), _ = multi_step(init, steps, dt, c)
        return ((uf - target) ** 2).mean()

    target = jnp.zeros((8, 8))
    u0 = jnp.ones_like(target)
    close(loss(u0, target, 10), 1.)
    close(jax.grad(loss)(u0, target, 10), 2 * u0 / u0.size)


@variants
def test_remat_jit3(ckpt):
    def f(w, x):
        a = jnp.dot(x, w)
        b = jnp.einsum("btd,bTd->btT", a, a)
        c = jnp.einsum("btT,btd->btd", b, a)
        return jnp.sum(c)

    w = jnp.full([1, 1], 2.)
    x = jnp.full([1, 1, 1], 3.)
    close(jax.grad(ckpt(f))(w, x), jax.grad(f)(w, x))

    @jax.jit
    def mul(a, b):
        return a * b

    def f2(w, x):
        a = mul(w, x)
        return mul(a, a)

    close(jax.grad(ckpt(f2))(2., 3.), jax.grad(f2)(2., 3.))


@variants
def test_remat_scan2(ckpt):
    def scan_bug(x0):
        f = lambda x, _: (x + 1, None)

        def scanned_f(x, _):
            return lax.scan(f, x, xs=None, length=1)[0], None

        x, _ = ckpt(scanned_f)(x0, None)
        return x

    close(jax.grad(scan_bug)(1.0), 1.0)


def test_remat_eval_counter():
    add_one_p = jex_core.Primitive("add_one")
    add_one = add_one_p.bind
    num_evals = 0

    @contextlib.contextmanager
    def assert_evals(n):
        start = num_evals
        yield
        assert num_evals - start == n

    def add_one_impl(x):
        nonlocal num_evals
        num_evals += 1
        return x + 1
    add_one_p.def_impl(add_one_impl)

    def add_one_jvp(pin, tin):
        pout = add_one(pin[0])
        return pout, pout * tin[0]
    ad.primitive_jvps[add_one_p] = add_one_jvp
    add_one_p.def_abstract_eval(lambda x: x)

    v = np.zeros((1,))
    f = remat.checkpoint(add_one)
    g = remat.checkpoint(lambda x: add_one(f(x)))

    with assert_evals(2):   # evaluating g
        _, vjp = jax.vjp(g, v)
    with assert_evals(3):   # 2 recomputed while transposing g, 1 while transposing f
        vjp(v)


def test_no_cse_widget_on_primals():
    @remat.checkpoint
    def g(x):
        return lax.sin(lax.sin(x)), 3.

    def f(x):
        x, _ = g(x)
        return x

    def has_widget(text):
        return ("while" in text or "conditional" in text or "opt-barrier" in text
                or "rng(" in text)

    assert not has_widget(jax.jit(f).lower(2.).as_text("hlo"))
    assert has_widget(jax.jit(jax.grad(f)).lower(2.).as_text("hlo"))


def test_no_cse_widget_with_prevent_cse_false():
    @partial(remat.checkpoint, prevent_cse=False)
    def g(x):
        return lax.sin(lax.sin(x)), 3.

    def f(x):
        x, _ = g(x)
        return x

    for fun in (f, jax.grad(f)):
        text = jax.jit(fun).lower(2.).as_text("hlo")
        assert "while" not in text
        assert "conditional" not in text
        assert "opt-barrier" not in text
        assert "rng(" not in text


@pytest.mark.parametrize("policy", [
    lambda *_, **__: False, remat.checkpoint_policies.everything_saveable,
    remat.checkpoint_policies.dots_saveable], ids=["nothing", "everything", "dots"])
def test_remat_of_scan(policy):
    to_scan = lambda c, _: (jnp.sin(c), jnp.sin(c))
    f = lambda x: lax.scan(to_scan, x, None, length=3)
    g = remat.checkpoint(f, policy=policy)
    check_grads(g, (3.,), order=2, modes=["rev"])

    # The cosines are recomputed in the linear function unless the policy lets
    # the forward pass save them.
    jaxpr = jax.make_jaxpr(jax.linearize(g, 4.)[1])(1.)
    saves_all = policy is remat.checkpoint_policies.everything_saveable
    assert (" cos " in str(jaxpr)) == (not saves_all)


def test_const_in_jvp_scan():
    # A checkpointed function with an array constant, jvp'd inside a jitted scan.
    @remat.checkpoint
    def f(x):
        return x * jnp.arange(1., 4.)

    @jax.jit
    def g(x):
        return lax.scan(lambda c, _: (f(c), None), x, None, length=2)[0]

    x = jnp.ones(3)
    y, y_dot = jax.jvp(g, (x,), (x,))
    close(y, jnp.arange(1., 4.) ** 2)
    close(y_dot, jnp.arange(1., 4.) ** 2)


@pytest.mark.parametrize("policy", [None, remat.checkpoint_policies.everything_saveable])
def test_remat_of_while_loop(policy):
    def cond_fn(carry):
        i, _ = carry
        return i < 3

    def body_fn(carry):
        i, x = carry
        return i + 1, jnp.sin(x)

    def f(x):
        _, y = lax.while_loop(cond_fn, body_fn, (0, x))
        return y

    _, f_lin = jax.linearize(remat.checkpoint(f, policy=policy), 3.)
    expected = jax.grad(lambda x: jnp.sin(jnp.sin(jnp.sin(x))))(3.)
    close(f_lin(1.0), expected)

    # A while loop cannot be split: all of it runs again in the linear function.
    jaxpr = jax.make_jaxpr(jax.linearize(remat.checkpoint(f, policy=policy), 4.)[1])(1.)
    assert " sin " in str(jaxpr)
    assert " cos " in str(jaxpr)


def _three_dots(x, batch=False):
    spec = "bij,bjk->bik" if batch else "ij,jk->ik"
    for _ in range(3):
        x = jnp.einsum(spec, x, x, precision=HIGHEST)
        x = jnp.sin(x)
    return x


def _linear_jaxpr_text(f, x):
    _, f_lin = jax.linearize(f, x)
    return str(jax.make_jaxpr(f_lin)(x))


def test_remat_checkpoint_dots():
    f = remat.checkpoint(_three_dots, policy=remat.checkpoint_policies.checkpoint_dots)
    text = _linear_jaxpr_text(f, jnp.ones((2, 2)))
    # The dot outputs are saved, so only the sines feeding the 2nd and 3rd dots
    # are recomputed; each dot's tangent takes two dots.
    assert text.count(" sin ") == 2
    assert text.count(" dot_general") == 6
    check_grads(f, (jnp.ones((2, 2)) * 0.5,), order=2, modes=["fwd", "rev"],
                atol=1e-2, rtol=1e-2)


def test_remat_checkpoint_dots_with_no_batch_dims():
    f = remat.checkpoint(
        _three_dots,
        policy=remat.checkpoint_policies.checkpoint_dots_with_no_batch_dims)
    text = _linear_jaxpr_text(f, jnp.ones((2, 2)))
    assert text.count(" sin ") == 2
    assert text.count(" dot_general") == 6

    # With a batch dimension no dot is saved: the first two sines and all three
    # dots are recomputed on top of the six tangent dots.
    g = remat.checkpoint(
        partial(_three_dots, batch=True),
        policy=remat.checkpoint_policies.checkpoint_dots_with_no_batch_dims)
    text = _linear_jaxpr_text(g, jnp.ones((3, 2, 2)))
    assert text.count(" dot_general") == 9
    assert text.count(" sin ") == 2


def test_remat_checkpoint_dots_with_policy_everything():
    f = remat.checkpoint(_three_dots,
                         policy=remat.checkpoint_policies.everything_saveable)
    text = _linear_jaxpr_text(f, jnp.ones((2, 2)))
    assert text.count(" sin ") == 0
    assert text.count(" dot_general") == 6


def test_remat_checkpoint_dots_jit():
    @jax.jit
    @partial(remat.checkpoint, policy=remat.checkpoint_policies.checkpoint_dots)
    def f(x):
        x = jnp.dot(x, x, precision=HIGHEST)
        x = jnp.sin(x * 1e-3)
        x = jnp.dot(x, x, precision=HIGHEST)
        x = jnp.sin(x * 1e-3)
        x = jnp.dot(x, x, precision=HIGHEST)
        x = jnp.sin(x * 1e-3)
        return x

    text = _linear_jaxpr_text(f, jnp.ones((2, 2)))
    assert text.count(" sin ") == 2
    assert text.count(" dot_general") == 6
    check_grads(f, (jnp.ones((2, 2)),), order=2, modes=["fwd", "rev"])


def test_remat_checkpoint_dots_inside_scan():
    x = jnp.ones((5,))

    def f(w):
        @partial(remat.checkpoint, policy=remat.checkpoint_policies.checkpoint_dots)
        def body_fun(x):
            x = jnp.sin(jnp.dot(x, w, precision=HIGHEST))
            x = jnp.sin(jnp.dot(x, w, precision=HIGHEST))
            x = jnp.sin(jnp.dot(x, w, precision=HIGHEST))
            return x

        return lax.scan(lambda x, _: (body_fun(x), None), x, None, length=2)[0]

    w = jnp.ones((5, 5)) * 0.1
    _, f_vjp = jax.vjp(f, w)
    text = str(jax.make_jaxpr(f_vjp)(x))
    # The backward body recomputes two sines (the third is the saved carry),
    # needs three cosines, and runs two dots per saved primal dot.
    assert text.count(" sin ") == 2
    assert text.count(" cos ") == 3
    assert text.count(" dot_general") == 6
    check_grads(f, (w,), order=1, modes=["fwd", "rev"], atol=1e-2, rtol=1e-2)


def _three_sin_dots(sin, x):
    for _ in range(3):
        x = jnp.dot(x, x, precision=HIGHEST)
        x = sin(x * 1e-3)
    return x


def test_remat_custom_jvp_policy():
    @jax.custom_jvp
    def sin(x):
        return jnp.sin(x)

    @sin.defjvp
    def sin_jvp(primals, tangents):
        x, = primals
        g, = tangents
        return sin(x), jnp.cos(x) * g

    f = remat.checkpoint(partial(_three_sin_dots, sin),
                         policy=remat.checkpoint_policies.dots_saveable)
    check_grads(f, (3.,), order=2, modes=["fwd", "rev"])

    def g(x):
        return lax.scan(lambda x, _: (f(x), None), x, None, length=2)[0]
    check_grads(g, (3.,), order=1, modes=["fwd", "rev"])


def test_remat_custom_vjp_policy():
    @jax.custom_vjp
    def sin(x):
        return jnp.sin(x)

    def sin_fwd(x):
        return sin(x), x

    def sin_bwd(x, y_bar):
        return (jnp.cos(x) * y_bar,)

    sin.defvjp(sin_fwd, sin_bwd)

    f = remat.checkpoint(partial(_three_sin_dots, sin),
                         policy=remat.checkpoint_policies.dots_saveable)
    check_grads(f, (3.,), order=2, modes=["rev"])

    def g(x):
        return lax.scan(lambda x, _: (f(x), None), x, None, length=2)[0]
    check_grads(g, (3.,), order=1, modes=["rev"])


def test_remat_dropout_polymorphism():
    # Random bits drawn inside the checkpoint are recomputed identically.
    def dropout(key, x):
        keep = jax.random.bernoulli(key, 0.5, x.shape)
        return jnp.where(keep, x / 0.5, 0.)

    def f(key, x):
        return jnp.sum(jnp.sin(dropout(key, jnp.sin(x))))

    key = jax.random.PRNGKey(1)
    x = jnp.arange(1., 9.)
    expected = jax.grad(f, argnums=1)(key, x)
    close(jax.grad(remat.checkpoint(f), argnums=1)(key, x), expected)
    close(jax.jit(jax.grad(remat.checkpoint(f), argnums=1))(key, x), expected)


def test_remat_residual_logging(caplog):
    @remat.checkpoint
    def f(x):
        return jnp.sin(jnp.sin(x))

    with caplog.at_level(logging.DEBUG, logger="remat"):
        jax.grad(lambda x: f(x).sum())(jnp.ones(3))
    messages = [r.getMessage() for r in caplog.records if r.name == "remat"]
    assert any(re.search(r"saves 1 residual.*\n  input (f32|float32)\[3\]$", m)
               for m in messages), messages


def test_constants_not_hoisted():
    nothing = lambda *_, **__: False

    # No residuals from constants created inside jnp.einsum.
    f = remat.checkpoint(lambda x: jnp.einsum("ii->i", x), policy=nothing)
    assert len(saved_residuals(f, jnp.ones((2, 2)))) == 0

    # None from jnp.zeros_like.
    f = remat.checkpoint(lambda x: jnp.zeros_like(x) * x, policy=nothing)
    assert len(saved_residuals(f, jnp.ones((2, 2)))) == 0

    # None from jnp.zeros_like, but the input must be saved.
    f = remat.checkpoint(lambda x: jnp.zeros_like(x) * jnp.sin(x), policy=nothing)
    assert len(saved_residuals(f, jnp.ones((2, 2)))) == 1


def test_name_saveable_input():
    # The policy saves the product that is then named; as with jax.checkpoint in
    # jax 0.10.2, the residual is reported as that product, not as the name.
    @partial(remat.checkpoint, policy=lambda p, *_, **__: "mul" in str(p))
    def f(x):
        x = checkpoint_name(x * x, "foo")
        return x * x

    res = saved_residuals(f, 3.)
    assert [src.split(" from ")[0] for _, src in res] == [
        "from the argument x", "output of mul"]


def _named_product(x):
    y = checkpoint_name(jnp.multiply(2., 2.), "y")
    z = checkpoint_name(jnp.multiply(2., 2.), "z")
    w = checkpoint_name(jnp.multiply(2., 2.), "w")
    u = jnp.multiply(2., 2.)
    return (((x * y) * z) * w) * u


@pytest.mark.parametrize("denied,num_saved", [
    (("y", "z", "w"), 0), (("z", "w"), 1), (("w",), 2), ((), 3)])
def test_name_denylist(denied, num_saved):
    policy = remat.checkpoint_policies.save_any_names_but_these(*denied)
    res = saved_residuals(remat.checkpoint(_named_product, policy=policy), 1.)
    assert len(res) == num_saved


@pytest.mark.parametrize("allowed,num_saved", [
    ((), 0), (("y",), 1), (("y", "z"), 2), (("y", "z", "w"), 3)])
def test_name_allowlist(allowed, num_saved):
    policy = remat.checkpoint_policies.save_only_these_names(*allowed)
    res = saved_residuals(remat.checkpoint(_named_product, policy=policy), 1.)
    assert len(res) == num_saved


def test_saved_residuals_utility():
    def f(x, y):
        x1, x2 = x
        z = checkpoint_name(jnp.sin(3.), "z")
        return z * ((x1 * x2) * y) * np.array([3.])

    res = saved_residuals(f, (2., 3.), y=4.)
    assert len(res) == 6
    shapes = {src.split(" from /")[0]: aval.shape for aval, src in res}
    assert shapes == {
        "from a constant": (1,),
        "from the argument x[0]": (),
        "from the argument x[1]": (),
        "from the argument y": (),
        "named 'z'": (),
        "output of mul": (),
    }


def test_remat_dce():
    @remat.checkpoint
    def f(x):
        return jnp.sin(x), jnp.cos(x)

    jaxpr = jax.make_jaxpr(lambda x: f(x)[0])(1.).jaxpr
    remat_eqn, = [e for e in jaxpr.eqns if e.primitive.name == "remat"]
    # Unused outputs survive tracing; DCE removes them from the body.
    assert len(remat_eqn.outvars) == 2
    pruned, used_inputs = pe.dce_jaxpr(jaxpr, [True])
    remat_eqn, = [e for e in pruned.eqns if e.primitive.name == "remat"]
    assert len(remat_eqn.outvars) == 1
    assert " cos " not in str(remat_eqn.params["jaxpr"])
    assert used_inputs == [True]

    # An equation none of whose outputs is used disappears.
    jaxpr = jax.make_jaxpr(lambda x: (f(x), 1.)[1])(1.).jaxpr
    pruned, used_inputs = pe.dce_jaxpr(jaxpr, [True])
    assert not pruned.eqns
    assert used_inputs == [False]


# ----------------------------------------------- from tests/lax_control_flow_test.py

@pytest.mark.parametrize("jit_scan", [False, True])
@pytest.mark.parametrize("jit_f", [False, True])
def test_scan_remat(jit_scan, jit_f):
    # A scan whose body is a checkpointed function, in all jit placements.
    d = np.array([1., 2.])

    def f(c, a):
        assert a.shape == (3,)
        assert c.shape == (4,)
        b = jnp.cos(jnp.sum(jnp.sin(a)) + jnp.sum(jnp.cos(c)) + jnp.sum(d))
        c = jnp.sin(c * b)
        return c, b

    if jit_f:
        f = jax.jit(f)
    scan = jax.jit(lax.scan, static_argnums=(0,)) if jit_scan else lax.scan

    rng = np.random.RandomState(0)
    as_ = rng.randn(5, 3).astype(np.float32)
    c = rng.randn(4).astype(np.float32)

    def loss(checkpointed, c, as_):
        body = remat.checkpoint(f) if checkpointed else f
        c, bs = scan(body, c, as_)
        return jnp.sum(c) + jnp.sum(bs)

    for argnums in (0, 1):
        close(jax.grad(partial(loss, True), argnums)(c, as_),
              jax.grad(partial(loss, False), argnums)(c, as_), rtol=1e-5, atol=1e-6)

    jaxpr = jax.make_jaxpr(jax.linearize(partial(loss, True), c, as_)[1])(c, as_)
    assert " sin " in str(jaxpr)


def test_scan_remat_consts():
    # The checkpointed body closes over a value computed outside the scan.
    def f(x):
        @remat.checkpoint
        def body(c, _):
            return jnp.sin(c * x), None
        return lax.scan(body, 1., None, length=3)[0]

    def f_plain(x):
        return lax.scan(lambda c, _: (jnp.sin(c * x), None), 1., None, length=3)[0]

    close(jax.grad(f)(0.7), jax.grad(f_plain)(0.7))
    close(jax.jit(jax.grad(f))(0.7), jax.grad(f_plain)(0.7))


def test_scan_remat_batched():
    def body(c, x):
        return remat.checkpoint(lambda c, x: (jnp.sin(c) * x, jnp.cos(c)))(c, x)

    def loss(c, xs):
        c, ys = lax.scan(body, c, xs)
        return jnp.sum(c) + jnp.sum(ys)

    def loss_plain(c, xs):
        c, ys = lax.scan(lambda c, x: (jnp.sin(c) * x, jnp.cos(c)), c, xs)
        return jnp.sum(c) + jnp.sum(ys)

    cs = jnp.linspace(0.1, 1., 4)
    xs = jnp.linspace(-1., 1., 12).reshape(4, 3)
    got = jax.vmap(jax.grad(loss, (0, 1)))(cs, xs)
    want = jax.vmap(jax.grad(loss_plain, (0, 1)))(cs, xs)
    jax.tree_util.tree_map(close, got, want)


def test_cond_remat():
    def f(x):
        return lax.cond(x > 0, jnp.sin, jnp.cos, x)

    for x in (2., -2.):
        close(jax.grad(remat.checkpoint(f))(x), jax.grad(f)(x))
        close(jax.jit(jax.grad(remat.checkpoint(f)))(x), jax.grad(f)(x))

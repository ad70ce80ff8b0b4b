"""Mutable refs inside remat.checkpoint: effects happen once, gradients stay right."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import remat

KINDS = [None, "no_grad_no_remat"]
JIT = [False, True]


def _maybe_jit(f, jit):
    return jax.jit(f) if jit else f


def _seed_example(y, x_ref):
    out = y * x_ref[...]
    x_ref[...] += 1
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", JIT)
def test_seed_example_effects_once(kind, jit):
    x_ref = jax.new_ref(1.0, kind=kind)
    grad = _maybe_jit(jax.grad(remat.checkpoint(_seed_example)), jit)(1.0, x_ref)
    assert float(grad) == 1.0
    assert float(x_ref[...]) == 2.0


#: (gradient, final ref value) of the seed example under ref_effects="replay": a
#: plain ref's read and write are replayed by the recomputation; JAX never
#: rematerializes accesses to a "no_grad_no_remat" ref, so it keeps the forward
#: read and writes once (what jax.checkpoint gives in a fresh process).
REPLAYED = {None: (2.0, 3.0), "no_grad_no_remat": (1.0, 2.0)}


def _replayed(kind, jit, fun=_seed_example):
    x_ref = jax.new_ref(1.0, kind=kind)
    f = remat.checkpoint(fun, ref_effects="replay")
    grad = _maybe_jit(jax.grad(f), jit)(1.0, x_ref)
    return float(grad), float(x_ref[...])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", JIT)
def test_replay_is_explicit(kind, jit):
    # ref_effects="replay" recomputes with the ref's current value and repeats the
    # write, as jax.checkpoint does, for the refs JAX rematerializes.
    assert _replayed(kind, jit) == REPLAYED[kind]


@pytest.mark.parametrize("jit", JIT)
def test_replay_does_not_depend_on_the_kind_traced_before(jit):
    # JAX's ref avals compare equal whatever their kind: a trace cached for a
    # plain ref must not be reused for a "no_grad_no_remat" one, or the other way.
    def example(y, x_ref):
        return _seed_example(y, x_ref)
    assert _replayed(None, jit, example) == REPLAYED[None]
    assert _replayed("no_grad_no_remat", jit, example) == REPLAYED["no_grad_no_remat"]
    assert _replayed(None, jit, example) == REPLAYED[None]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", JIT)
def test_accumulation_into_ref_argument(kind, jit):
    k1, k2 = jax.random.split(jax.random.key(jit))
    w = jax.random.normal(k1, (8, 8)) / 3
    x = jax.random.normal(k2, (4, 8))

    def layer(w, x, stats_ref):
        h = jnp.tanh(x @ w)
        stats_ref[...] += jax.lax.stop_gradient(h.sum(0))
        return jnp.tanh(h @ w)

    def grad_of(wrap):
        loss = lambda w, x, r: jnp.sum(wrap(layer)(w, x, r) ** 2)
        stats_ref = jax.new_ref(jnp.zeros(8), kind=kind)
        return _maybe_jit(jax.grad(loss), jit)(w, x, stats_ref), stats_ref

    want, plain_ref = grad_of(lambda f: f)
    got, ours_ref = grad_of(remat.checkpoint)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(ours_ref[...], plain_ref[...], rtol=1e-6)
    assert np.all(np.asarray(ours_ref[...]) != 0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", JIT)
def test_closed_over_ref(kind, jit):
    x_ref = jax.new_ref(3.0, kind=kind)

    def f(y):
        out = jnp.sin(y * x_ref[...])
        x_ref[...] += 1
        return out

    grad = _maybe_jit(jax.grad(remat.checkpoint(f)), jit)(0.5)
    np.testing.assert_allclose(grad, 3.0 * np.cos(1.5), rtol=1e-6)
    assert float(x_ref[...]) == 4.0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", JIT)
def test_nested_checkpoints(kind, jit):
    x_ref = jax.new_ref(2.0, kind=kind)

    def inner(y):
        out = y * x_ref[...]
        x_ref[...] += 1
        return jnp.sin(out)

    def outer(y):
        return remat.checkpoint(inner)(y) * x_ref[...]

    # value before: 2 -> inner reads 2, writes 3; outer reads 3.
    grad = _maybe_jit(jax.grad(remat.checkpoint(outer)), jit)(0.25)
    np.testing.assert_allclose(grad, 2.0 * np.cos(0.5) * 3.0, rtol=1e-6)
    assert float(x_ref[...]) == 3.0


@pytest.mark.parametrize("policy", [None, remat.checkpoint_policies.everything_saveable,
                                    remat.checkpoint_policies.dots_saveable])
def test_any_policy(policy):
    x_ref = jax.new_ref(1.0)
    grad = jax.grad(remat.checkpoint(_seed_example, policy=policy))(1.0, x_ref)
    assert (float(grad), float(x_ref[...])) == (1.0, 2.0)


@pytest.mark.parametrize("jit", JIT)
def test_ref_in_scan_body(jit):
    def run(wrap):
        acc = jax.new_ref(jnp.zeros(3))

        def body(c, x):
            acc[...] += jax.lax.stop_gradient(c)
            return jnp.sin(c * x), None

        def loss(c0, xs):
            c, _ = jax.lax.scan(wrap(body), c0, xs)
            return c.sum()

        c0 = jax.random.uniform(jax.random.key(3), (3,), minval=0.1, maxval=0.5)
        g = _maybe_jit(jax.grad(loss), jit)(c0, jnp.arange(1.0, 5.0))
        return g, acc[...]

    (g_plain, acc_plain), (g_ours, acc_ours) = run(lambda f: f), run(remat.checkpoint)
    np.testing.assert_allclose(g_ours, g_plain, rtol=1e-6)
    np.testing.assert_allclose(acc_ours, acc_plain, rtol=1e-6)


def test_internal_refs_are_pure():
    def f(y):
        r = jax.new_ref(jnp.zeros(()))
        r[...] += y * y
        r[...] += jnp.sin(y)
        return r[...]

    for jit in JIT:
        np.testing.assert_allclose(_maybe_jit(jax.grad(remat.checkpoint(f)), jit)(0.7),
                                   2 * 0.7 + np.cos(0.7), rtol=1e-6)


def test_no_retracing_for_refs():
    traces = []

    def f(y, x_ref):
        traces.append(1)
        return _seed_example(y, x_ref)

    g = jax.grad(remat.checkpoint(f))
    g(1.0, jax.new_ref(1.0))
    g(2.0, jax.new_ref(1.0))
    assert len(traces) == 1


def test_debug_callback_fires_per_forward_and_recomputation_level():
    calls = []

    def f(x):
        jax.debug.callback(lambda: calls.append(1))
        return jnp.sin(x)

    g = remat.checkpoint(remat.checkpoint(remat.checkpoint(f)))
    g(1.0)
    assert len(calls) == 1
    for run in (jax.grad(g), jax.jit(jax.grad(g))):
        calls.clear()
        run(1.0)
        assert len(calls) == 4      # the forward, then one recomputation per level


def test_unsupported_effect_is_named():
    def f(x):
        io_callback(lambda: None, None, ordered=True)
        return jnp.sin(x)

    with pytest.raises(NotImplementedError, match="OrderedIO"):
        jax.grad(remat.checkpoint(f))(1.0)


def test_bad_ref_effects_value():
    with pytest.raises(ValueError, match="ref_effects must be one of"):
        remat.checkpoint(jnp.sin, ref_effects="twice")


# ------------------------------------------------- writes made by backward rules

@jax.custom_vjp
def _stash(ref, x):
    """Identity whose backward rule writes the incoming cotangent into ``ref``."""
    return x


def _stash_bwd(ref, g):
    ref[...] = g
    return None, g


_stash.defvjp(lambda ref, x: (x, ref), _stash_bwd)


@jax.custom_vjp
def _scaled(ref, x):
    """``x * ref``; the backward rule writes ``max|g| + scale`` back (the FP8
    scaling pattern: forward reads the ref, backward updates it)."""
    return x * ref[...]


def _scaled_fwd(ref, x):
    scale = ref[...]
    return x * scale, (ref, scale)


def _scaled_bwd(res, g):
    ref, scale = res
    ref[...] = jnp.max(jnp.abs(g)) + scale
    return None, g * scale


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


def _backward_write_program(case, wrap, r):
    """``loss(y)`` for one way a checkpointed function hands ``r`` to a backward rule."""
    if case == "argument":
        f = wrap(lambda ref, y: jnp.sin(_stash(ref, jnp.sin(y))))
        return lambda y: f(r, y)
    if case == "closed_over":
        return wrap(lambda y: jnp.sin(_stash(r, jnp.sin(y))))
    if case == "nested":
        inner = wrap(lambda y: jnp.cos(_stash(r, jnp.sin(y))))
        return wrap(lambda y: jnp.sin(2 * inner(y)))
    if case == "scan":
        body = wrap(lambda c, x: (jnp.sin(_stash(r, c * x)), None))
        return lambda y: jax.lax.scan(body, y, jnp.arange(1.0, 4.0))[0]
    if case == "cond":
        # (JAX itself cannot linearize a cond whose branch saves a ref for a
        # backward rule, so the ref is read in the cond and stashed after it.)
        return wrap(lambda y: jnp.sin(_stash(r, jax.lax.cond(
            y > 0, lambda y: jnp.sin(y * r[...]), jnp.cos, y))))
    if case == "forward_read":
        return wrap(lambda y: jnp.sin(_scaled(r, jnp.sin(y))))
    if case == "forward_read_scan":
        body = wrap(lambda c, x: (jnp.sin(_scaled(r, c * x)), None))
        return lambda y: jax.lax.scan(body, y, jnp.arange(1.0, 4.0))[0]
    if case == "forward_read_jit":
        # The reading custom_vjp sits in a jitted function inside the region.
        body = wrap(lambda c, x: (jnp.sin(jax.jit(lambda c: _scaled(r, c * x))(c)), None))
        return lambda y: jax.lax.scan(body, y, jnp.arange(1.0, 4.0))[0]
    if case == "forward_write":
        def f(y):
            r[...] += 1.0
            return jnp.cos(_scaled(r, jnp.sin(y * r[...])))
        return wrap(f)
    raise ValueError(case)


BACKWARD_CASES = ["argument", "closed_over", "nested", "scan", "cond", "forward_read",
                  "forward_read_scan", "forward_read_jit", "forward_write"]


def _backward_write_run(case, wrap, jit, kind):
    r = jax.new_ref(jnp.float32(0.5), kind=kind)
    grad = _maybe_jit(jax.grad(_backward_write_program(case, wrap, r)), jit)
    return float(grad(jnp.float32(0.7))), float(r[...])


@pytest.mark.parametrize("case", BACKWARD_CASES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", JIT)
def test_backward_rule_writes_reach_the_callers_ref(case, kind, jit):
    # The gradient and the ref's final value are the plain program's: the
    # backward rule's write lands once in the caller's ref, forward reads see
    # the values of the forward pass (with a plain ref jax.checkpoint re-reads
    # the ref updated by a later backward, and differs, in the forward_read_scan,
    # forward_read_jit and forward_write cases; it cannot differentiate the cond
    # case).
    want = _backward_write_run(case, lambda f: f, jit, kind)
    got = _backward_write_run(case, remat.checkpoint, jit, kind)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert want[1] != 0.5           # the backward rule did write


def test_stash_example_matches_jax_checkpoint():
    def run(ck):
        f = ck(lambda ref, y: jnp.sin(_stash(ref, jnp.sin(y))))
        r = jax.new_ref(jnp.float32(0.))
        g = jax.grad(f, 1)(r, jnp.float32(1.))
        return float(g), float(r[...])
    got, want = run(remat.checkpoint), run(jax.checkpoint)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got[1], np.cos(np.sin(1.0)), rtol=1e-6)


@pytest.mark.parametrize("jit", JIT)
def test_backward_rule_writes_under_replay(jit):
    # "replay" hands every ref to the region; the backward write lands there too.
    f = remat.checkpoint(lambda ref, y: jnp.sin(_stash(ref, jnp.sin(y))),
                         ref_effects="replay")
    r = jax.new_ref(jnp.float32(0.))
    _maybe_jit(jax.grad(f, 1), jit)(r, jnp.float32(1.))
    np.testing.assert_allclose(float(r[...]), np.cos(np.sin(1.0)), rtol=1e-6)


@pytest.mark.parametrize("jit", JIT)
def test_custom_vjp_rule_kept_beside_refs(jit):
    # Taking refs by value must not inline a custom_vjp: its rule (here a
    # deliberately "wrong" gradient, 2 * g) is the one differentiation uses.
    @jax.custom_vjp
    def double_grad(x):
        return jnp.sin(x)
    double_grad.defvjp(lambda x: (jnp.sin(x), None), lambda _, g: (2 * g,))

    def internal(y):
        r = jax.new_ref(jnp.float32(0.))
        r[...] += y
        return double_grad(r[...])

    def external(y, q):
        q[...] += 1.0
        return double_grad(y * q[...])

    for f, args in [(internal, ()), (external, (jax.new_ref(jnp.float32(1.)),))]:
        got = _maybe_jit(jax.grad(remat.checkpoint(f)), jit)(jnp.float32(0.3), *args)
        args = (jax.new_ref(jnp.float32(1.)),) if args else ()
        want = jax.grad(f)(jnp.float32(0.3), *args)
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_forward_only_ref_in_a_while_loop_is_a_clear_error(kind):
    # JAX cannot split a while_loop whose body reads a ref that must stay in the
    # forward pass (it fails an internal assertion for such refs); say so.
    r = jax.new_ref(jnp.float32(0.5), kind=kind)

    def f(y):
        n = jax.lax.while_loop(lambda s: s[0] < 3,
                               lambda s: (s[0] + 1, s[1] + r[...]), (0, 0.))[1]
        return jnp.sin(_scaled(r, y) * n)

    with pytest.raises(NotImplementedError, match=r"inside a lax.while_loop.*"
                                                  r"ref_effects='replay'"):
        jax.grad(remat.checkpoint(f))(jnp.float32(0.7))
    # Without differentiation nothing is split: the call runs.
    np.testing.assert_allclose(remat.checkpoint(f)(jnp.float32(0.7)),
                               np.sin(0.7 * 0.5 * 1.5), rtol=1e-6)


def test_saved_residuals_list_the_backward_ref_and_the_saved_read():
    # The forward read of a backward ref is saved (not re-read), and the ref
    # itself travels to the backward rule; saved_residuals shows both.
    r = jax.new_ref(jnp.float32(0.5))
    f = remat.checkpoint(lambda y: jnp.sin(_scaled(r, jnp.sin(y))))
    saved = [(aval.str_short(), src) for aval, src in
             remat.saved_residuals(f, jnp.float32(0.3))]
    assert ("Ref{float32[]}", "from a constant") in saved
    assert any(src.startswith("output of get from") for _, src in saved)

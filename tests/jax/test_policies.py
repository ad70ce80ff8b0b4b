"""Each saving policy's decisions, read back through ``remat.saved_residuals``.

The function below has a dot without batch dimensions (``x @ w``, f32[2,5]), a
batched dot (f32[4,2,2]), elementwise operations, and three named values; its
residual shapes and descriptions tell which values a policy kept. The offloading
policies run too: this jax gives the CPU device a pinned_host memory space.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import remat
from remat import checkpoint_name
from remat._jax.compat import Offloadable, Recompute, Saveable

P = remat.checkpoint_policies


def f(w, xb, x):
    a = checkpoint_name(x @ w, "a")                                 # f32[2,5]
    b = checkpoint_name(jnp.einsum("bij,bjk->bik", xb, xb), "b")   # f32[4,2,2]
    c = checkpoint_name(jnp.sin(a) * 2., "c")                       # f32[2,5]
    return jnp.sum(jnp.sin(c) * jnp.cos(a)) + jnp.sum(jnp.sin(b))


ARGS = (jnp.full((3, 5), 0.3), jnp.full((4, 2, 2), 0.7), jnp.full((2, 3), 1.1))


def residuals(fun, *args):
    """``[(shape, description without its source location)]``."""
    return [(aval.shape, src.split(" from /")[0].split(" from <")[0])
            for aval, src in remat.saved_residuals(fun, *args)]


def saved(policy, fun=f, args=ARGS):
    """What checkpointing ``fun`` with ``policy`` saves besides the inputs."""
    res = residuals(remat.checkpoint(fun, policy=policy), *args)
    return sorted((shape, d) for shape, d in res if not d.startswith("from the argument"))


def grads_match(policy, fun=f, args=ARGS):
    argnums = tuple(range(len(args)))
    got = jax.grad(remat.checkpoint(fun, policy=policy), argnums)(*args)
    want = jax.grad(fun, argnums)(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------- built-in policies

def test_nothing_saveable():
    assert saved(P.nothing_saveable) == []
    assert saved(None) == []
    grads_match(P.nothing_saveable)


def test_everything_saveable():
    # The same residuals as no checkpoint at all.
    assert saved(P.everything_saveable) == sorted(
        r for r in residuals(f, *ARGS) if not r[1].startswith("from the argument"))
    grads_match(P.everything_saveable)


@pytest.mark.parametrize("policy", [P.dots_saveable, P.checkpoint_dots])
def test_dots_saveable(policy):
    assert saved(policy) == [((2, 5), "output of dot_general"),
                             ((4, 2, 2), "output of dot_general")]
    grads_match(policy)


@pytest.mark.parametrize("policy", [P.dots_with_no_batch_dims_saveable,
                                    P.checkpoint_dots_with_no_batch_dims])
def test_dots_with_no_batch_dims_saveable(policy):
    # The unbatched dot is saved, the batched one recomputed.
    assert saved(policy) == [((2, 5), "output of dot_general")]
    grads_match(policy)


def _conv(w, x):
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME")
    return jnp.sum(jnp.sin(y))


def test_convolutions():
    args = (jnp.full((2, 1, 3, 3), 0.1), jnp.full((1, 1, 4, 4), 0.5))
    conv_out = [((1, 2, 4, 4), "output of conv_general_dilated")]
    assert saved(P.dots_saveable, _conv, args) == conv_out
    # A convolution always has a batch dimension.
    assert saved(P.dots_with_no_batch_dims_saveable, _conv, args) == []
    grads_match(P.dots_saveable, _conv, args)


@pytest.mark.parametrize("names,expected", [
    ((), []),
    (("a",), [((2, 5), "named 'a'")]),
    (("b",), [((4, 2, 2), "named 'b'")]),
    (("a", "c"), [((2, 5), "named 'a'"), ((2, 5), "named 'c'")]),
    (("missing",), []),
])
def test_save_only_these_names(names, expected):
    policy = P.save_only_these_names(*names)
    assert saved(policy) == sorted(expected)
    grads_match(policy)


@pytest.mark.parametrize("names,expected", [
    ((), [((2, 5), "named 'a'"), ((2, 5), "named 'c'"), ((4, 2, 2), "named 'b'")]),
    (("a",), [((2, 5), "named 'c'"), ((4, 2, 2), "named 'b'")]),
    (("a", "b", "c"), []),
])
def test_save_any_names_but_these(names, expected):
    # Only named values are candidates; unnamed ones are never saved.
    policy = P.save_any_names_but_these(*names)
    assert saved(policy) == sorted(expected)
    grads_match(policy)


def test_save_anything_except_these_names():
    everything = saved(P.everything_saveable)
    # Excluding nothing saves what everything_saveable saves.
    assert saved(P.save_anything_except_these_names()) == everything
    # Excluding 'b' recomputes the batched dot: sin(b)'s cosine is saved instead
    # of computed from a saved b, and nothing named 'b' or the batched dot's output
    # is kept.
    policy = P.save_anything_except_these_names("b")
    res = saved(policy)
    assert ((4, 2, 2), "named 'b'") not in res
    assert ((4, 2, 2), "output of dot_general") not in res
    assert any(shape == (4, 2, 2) for shape, _ in res)
    grads_match(policy)
    # Excluding every name: unnamed intermediates are still saved.
    res = saved(P.save_anything_except_these_names("a", "b", "c"))
    assert res and not any(d.startswith("named") for _, d in res)


def test_save_from_both_policies():
    policy = P.save_from_both_policies(P.dots_with_no_batch_dims_saveable,
                                       P.save_only_these_names("c"))
    assert saved(policy) == [((2, 5), "named 'c'"), ((2, 5), "output of dot_general")]
    grads_match(policy)
    both_dots = P.save_from_both_policies(P.dots_with_no_batch_dims_saveable,
                                          P.dots_saveable)
    assert saved(both_dots) == saved(P.dots_saveable)
    neither = P.save_from_both_policies(P.nothing_saveable, P.nothing_saveable)
    assert saved(neither) == []


def test_save_from_both_policies_rejects_offloading():
    offload = P.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["a"],
        offload_src="device", offload_dst="pinned_host")
    policy = P.save_from_both_policies(P.dots_saveable, offload)
    with pytest.raises(ValueError, match="save_from_both_policies"):
        remat.saved_residuals(remat.checkpoint(f, policy=policy), *ARGS)


def _name_prim():
    jaxpr = jax.make_jaxpr(lambda x: checkpoint_name(x, "n"))(1.)
    eqn, = jaxpr.jaxpr.eqns
    return eqn.primitive


def test_save_and_offload_only_these_names_decisions():
    policy = P.save_and_offload_only_these_names(
        names_which_can_be_saved=["a"], names_which_can_be_offloaded=["b"],
        offload_src="device", offload_dst="pinned_host")
    name_p = _name_prim()
    aval = jax.core.ShapedArray((2,), jnp.float32)
    assert policy(name_p, aval, name="a") is Saveable
    offloaded = policy(name_p, aval, name="b")
    assert isinstance(offloaded, Offloadable)
    assert (offloaded.src, offloaded.dst) == ("device", "pinned_host")
    assert policy(name_p, aval, name="c") is Recompute
    assert policy(lax.sin_p, aval) is Recompute
    # Tracing the VJP needs no host memory: the offloaded value is a residual in
    # the destination memory space, the saved one stays put.
    res = remat.saved_residuals(remat.checkpoint(f, policy=policy), *ARGS)
    kinds = sorted((aval.shape, str(getattr(aval, "memory_space", "")).lower(),
                    src.split(" from ")[0]) for aval, src in res
                   if not src.startswith("from the argument"))
    assert [k[0] for k in kinds] == [(2, 5), (4, 2, 2)]
    assert kinds[0][2] == "named 'a'"
    assert "host" in kinds[1][1]


def test_save_and_offload_only_these_names_overlap():
    with pytest.raises(ValueError, match=r"must not overlap.*\['b'\]"):
        P.save_and_offload_only_these_names(
            names_which_can_be_saved=["a", "b"], names_which_can_be_offloaded=["b"],
            offload_src="device", offload_dst="pinned_host")


def test_offload_dot_with_no_batch_dims_decisions():
    policy = P.offload_dot_with_no_batch_dims("device", "pinned_host")
    calls = []

    def spy(prim, *avals, **params):
        answer = policy(prim, *avals, **params)
        calls.append((prim, tuple(a.shape for a in avals), answer))
        return answer

    remat.saved_residuals(remat.checkpoint(f, policy=spy), *ARGS)
    dots = {shapes: answer for prim, shapes, answer in calls
            if prim is lax.dot_general_p}
    unbatched, batched = dots[((2, 3), (3, 5))], dots[((4, 2, 2), (4, 2, 2))]
    assert isinstance(unbatched, Offloadable)
    assert (unbatched.src, unbatched.dst) == ("device", "pinned_host")
    assert batched is Recompute
    assert all(a is Recompute for p, _, a in calls if p is not lax.dot_general_p)


# ----------------------------------------------------------- user-written policy

def test_custom_policy_called_with_prim_avals_params():
    calls = []

    def policy(prim, *avals, **params):
        calls.append((prim, avals, params))
        return prim is lax.sin_p

    # Saved: sin(a) (to recompute c), sin(c) (a factor of the product) and the
    # sine in cos(a)'s derivative. sin(b) is not needed by the backward pass (it
    # needs cos(b), which is recomputed), so it is not saved either.
    assert saved(policy) == [((2, 5), "output of sin")] * 3
    grads_match(policy)

    prims = {prim for prim, _, _ in calls}
    assert {lax.dot_general_p, lax.sin_p, lax.cos_p} <= prims
    for prim, avals, params in calls:
        assert all(isinstance(a, jax.core.ShapedArray) for a in avals)
        if prim is lax.dot_general_p and avals[0].shape == (2, 3):
            assert avals[1].shape == (3, 5)
            (_, _), (lhs_batch, rhs_batch) = params["dimension_numbers"]
            assert lhs_batch == rhs_batch == ()
        if prim is _name_prim():
            assert params["name"] in ("a", "b", "c")


def test_custom_policy_may_answer_saveable_and_recompute():
    policy = lambda prim, *_, **__: Saveable if prim is lax.dot_general_p else Recompute
    assert saved(policy) == saved(P.dots_saveable)
    grads_match(policy)


def test_jax_policies_work_with_remat_and_agree():
    # A policy from jax.checkpoint_policies works unchanged, and remat's policies
    # make the same decisions as JAX's under jax.checkpoint.
    pairs = [
        (P.dots_saveable, jax.checkpoint_policies.dots_saveable),
        (P.dots_with_no_batch_dims_saveable,
         jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
        (P.save_only_these_names("a", "b"),
         jax.checkpoint_policies.save_only_these_names("a", "b")),
        (P.save_any_names_but_these("a"),
         jax.checkpoint_policies.save_any_names_but_these("a")),
        (P.save_anything_except_these_names("b"),
         jax.checkpoint_policies.save_anything_except_these_names("b")),
    ]
    for ours, theirs in pairs:
        assert saved(theirs) == saved(ours)
        with_jax = residuals(jax.checkpoint(f, policy=theirs), *ARGS)
        with_remat = residuals(remat.checkpoint(f, policy=ours), *ARGS)
        assert sorted(with_jax) == sorted(with_remat)


def test_policy_inside_jit_and_scan():
    # The jaxpr-level partial evaluator applies the policy too: a checkpoint
    # inside jit, and a checkpointed scan body.
    ck = jax.jit(remat.checkpoint(f, policy=P.dots_with_no_batch_dims_saveable))
    res = [d for _, d in residuals(ck, *ARGS)]
    assert not any("dot_general" in d for d in res)   # hidden inside the jit
    jaxpr = str(jax.make_jaxpr(lambda *a: jax.vjp(ck, *a)[1](1.))(*ARGS))
    # The backward recomputes the batched dot (one more dot_general than the
    # forward's two and the backward's four).
    assert jaxpr.count(" dot_general") == 7

    def scanned(policy, w, xs):
        body = remat.checkpoint(lambda c, x: (jnp.sin(c @ w), None), policy=policy)
        return jnp.sum(lax.scan(body, xs, None, length=3)[0])

    # The scan stacks its per-iteration residuals: the carries (f32[2,3] each)
    # always, and with dots_saveable the dot outputs too.
    args = (jnp.full((3, 3), 0.2), jnp.full((2, 3), 0.4))
    for policy, num_stacked in [(None, 1), (P.dots_saveable, 2)]:
        res = residuals(partial(scanned, policy), *args)
        assert res.count(((3, 2, 3), "output of scan")) == num_stacked
        grads_match(policy, partial(scanned, policy), args)


def test_named_residual_names_the_users_line():
    policy = P.save_only_these_names("a")
    (aval, src), = [r for r in remat.saved_residuals(
        remat.checkpoint(f, policy=policy), *ARGS) if r[1].startswith("named")]
    assert aval.shape == (2, 5)
    assert src.startswith("named 'a' from ")
    assert "test_policies.py" in src and "(f)" in src


def test_offloading_policies_run_on_cpu():
    # This jax's CPU device has a pinned_host memory space, so the offloading
    # policies run end to end: the gradients match, eagerly and under jit.
    names = P.save_and_offload_only_these_names(
        names_which_can_be_saved=["a"], names_which_can_be_offloaded=["b", "c"],
        offload_src="device", offload_dst="pinned_host")
    dots = P.offload_dot_with_no_batch_dims("device", "pinned_host")
    for policy in (names, dots):
        grads_match(policy)
        got = jax.jit(jax.grad(remat.checkpoint(f, policy=policy), (0, 1, 2)))(*ARGS)
        want = jax.grad(f, (0, 1, 2))(*ARGS)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)

"""Random small programs with refs: checkpointing them changes nothing.

Each program threads a vector through a list of operations: plain math, reads and
writes of refs in the forward pass, custom_vjp calls whose backward rule writes to
a ref (alone, or after reading it in the forward pass), and ``lax.scan`` and
``lax.cond`` around sub-programs. Its top level is cut into segments, each under
``remat.checkpoint`` (optionally all of it under one more checkpoint, and the scan
bodies too), one ref passed as an argument and one closed over. The output, the
gradient and the final value of every ref must be those of the same program
without checkpointing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

import remat
from tests.jax.test_refs import _stash   # identity; its backward rule stores g

N = 3           # the length of the vector and of each ref
NUM_REFS = 2    # ref 0 is an argument of every segment, ref 1 is closed over


@jax.custom_vjp
def _scaled(ref, x):
    return x * ref[...]


def _scaled_fwd(ref, x):
    scale = ref[...]
    return x * scale, (ref, scale)


def _scaled_bwd(res, g):
    ref, scale = res
    ref[...] = jnp.tanh(g) + scale
    return None, g * scale


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


# ------------------------------------------------------------------ programs

_ref = st.integers(0, NUM_REFS - 1)
# Operations allowed anywhere (a cond branch only takes these: JAX cannot
# linearize a cond whose branch saves a ref for a backward rule).
_plain_op = st.one_of(
    st.just(("sin",)), st.just(("tanh",)),
    st.tuples(st.just("read"), _ref),       # x = x * ref
    st.tuples(st.just("write"), _ref),      # ref = sin(x), not differentiated
    st.tuples(st.just("accum"), _ref))      # ref += x, not differentiated
_backward_op = st.one_of(
    st.tuples(st.just("stash"), _ref),      # the backward writes the cotangent
    st.tuples(st.just("scaled"), _ref))     # forward reads, backward writes
_flat_op = st.one_of(_plain_op, _backward_op)
_op = st.one_of(
    _flat_op,
    st.tuples(st.just("scan"), st.lists(_flat_op, min_size=1, max_size=3),
              st.booleans()),               # checkpoint the scan body?
    st.tuples(st.just("cond"), st.lists(_plain_op, min_size=1, max_size=2),
              st.lists(_plain_op, min_size=1, max_size=2)))


def _run(ops, x, refs, ck):
    """Applies ``ops`` to ``x``; ``ck`` wraps scan bodies that ask for it."""
    for op in ops:
        kind = op[0]
        if kind == "sin":
            x = jnp.sin(x)
        elif kind == "tanh":
            x = jnp.tanh(x)
        elif kind == "read":
            x = x * refs[op[1]][...]
        elif kind == "write":
            refs[op[1]][...] = jax.lax.stop_gradient(jnp.sin(x))
        elif kind == "accum":
            refs[op[1]][...] += jax.lax.stop_gradient(x)
        elif kind == "stash":
            x = _stash(refs[op[1]], x)
        elif kind == "scaled":
            x = _scaled(refs[op[1]], x)
        elif kind == "scan":
            body_ops, checkpointed = op[1], op[2]

            def body(c, s, body_ops=body_ops):
                return _run(body_ops, c * s, refs, ck), None
            body = ck(body) if checkpointed else body
            x, _ = jax.lax.scan(body, x, jnp.array([0.9, 1.1]))
        elif kind == "cond":
            x = jax.lax.cond(jnp.sum(x) > 0,
                             lambda x, a=op[1]: _run(a, x, refs, ck),
                             lambda x, b=op[2]: _run(b, x, refs, ck), x)
    return x


def _evaluate(program, ck, kinds, jit):
    """(output, gradient, final ref values) of ``program`` with checkpoints made
    by ``ck`` (the identity for the reference run)."""
    ops, cuts, outer = program
    refs = [jax.new_ref(jnp.linspace(0.6, 1.4, N) + i, kind=k)
            for i, k in enumerate(kinds)]
    segments, start = [], 0
    for end in sorted(set(cuts) | {len(ops)}):
        if end > start:
            segments.append(ops[start:end])
            start = end

    def segment_fn(seg):
        def f(x, arg_ref):       # ref 0 as an argument, ref 1 closed over
            return _run(seg, x, [arg_ref, refs[1]], ck)
        return ck(f)

    fns = [segment_fn(seg) for seg in segments]

    def loss(x, arg_ref):
        for f in fns:
            x = f(x, arg_ref)
        return jnp.sum(jnp.sin(x))

    loss = ck(loss) if outer else loss
    run = jax.value_and_grad(loss)
    run = jax.jit(run) if jit else run
    out, grad = run(jnp.array([0.3, -0.5, 0.7]), refs[0])
    return np.asarray(out), np.asarray(grad), [np.asarray(r[...]) for r in refs]


_programs = st.lists(_op, min_size=1, max_size=5).flatmap(
    lambda ops: st.tuples(st.just(ops),
                          st.lists(st.integers(1, len(ops)), max_size=2),
                          st.booleans()))
_policies = st.sampled_from([None, remat.checkpoint_policies.everything_saveable,
                             remat.checkpoint_policies.dots_saveable])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(program=_programs,
       kinds=st.tuples(*[st.sampled_from([None, "no_grad_no_remat"])] * NUM_REFS),
       policy=_policies, jit=st.booleans())
def test_random_ref_programs_match_the_plain_program(program, kinds, policy, jit):
    try:
        want = _evaluate(program, lambda f: f, kinds, jit)
    except NotImplementedError:
        reject()                  # a program JAX itself cannot differentiate
    ck = lambda f: remat.checkpoint(f, policy=policy)
    got = _evaluate(program, ck, kinds, jit)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    for got_ref, want_ref in zip(got[2], want[2]):
        np.testing.assert_allclose(got_ref, want_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_a_program_with_every_kind_of_operation(jit):
    # One fixed program that has each operation, so a regression in any of
    # them shows up without relying on the random search to find it.
    ops = [("read", 0), ("write", 1), ("stash", 0), ("scan", [("scaled", 1), ("sin",)], True),
           ("accum", 0), ("cond", [("read", 1)], [("tanh",)]), ("scaled", 0)]
    program = (ops, [2, 4], True)
    for kinds in [(None, None), ("no_grad_no_remat", None)]:
        want = _evaluate(program, lambda f: f, kinds, jit)
        got = _evaluate(program, remat.checkpoint, kinds, jit)
        for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

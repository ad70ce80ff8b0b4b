"""A checkpointed function must have the same values and derivatives as the plain
function under every JAX transformation, and compose with control flow, custom
derivatives, nesting and every lowering strategy.

The tests run in float64 (``jax.enable_x64`` around each test): in float32, XLA's
fusion decisions alone move jitted results by ~1e-6 relative, far above what a
tight comparison allows; in float64 that noise is ~1e-15, so RTOL = 1e-6 is tight
and still deterministic.
"""

from __future__ import annotations

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import remat

RTOL = ATOL = 1e-6
POLICIES = {
    "nothing": None,
    "dots": remat.checkpoint_policies.dots_saveable,
    "everything": remat.checkpoint_policies.everything_saveable,
}
policies = pytest.mark.parametrize("policy", list(POLICIES.values()),
                                   ids=list(POLICIES))
LOWERINGS = ["cond", "gate", "barrier", "while"]
_keys = itertools.count()


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def rand(*shape, dtype=None):
    """Fresh nonzero random values: uniform in [0.5, 1.5) with random signs."""
    dtype = dtype or jnp.result_type(float)
    k1, k2 = jax.random.split(jax.random.PRNGKey(next(_keys)))
    mag = jax.random.uniform(k1, shape, dtype, minval=0.5, maxval=1.5)
    return jnp.where(jax.random.bernoulli(k2, 0.5, shape), mag, -mag)


def close(a, b, rtol=RTOL, atol=ATOL):
    ta, tb = jax.tree_util.tree_structure(a), jax.tree_util.tree_structure(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert jnp.shape(x) == jnp.shape(y)
        assert jnp.result_type(x) == jnp.result_type(y)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def block(w1, w2, x):
    """A small two-layer block with elementwise nonlinearities."""
    h = jnp.tanh(jnp.dot(x, w1, precision=lax.Precision.HIGHEST))
    h = jnp.sin(h) * jnp.cos(x).sum()
    return jnp.dot(h, w2, precision=lax.Precision.HIGHEST) * jnp.exp(-h[:, :1] ** 2)


def block_args():
    return rand(3, 4), rand(4, 3), rand(2, 3)


def scalar(f):
    return lambda *a, **k: jnp.sum(f(*a, **k) ** 2)


# ------------------------------------------------------------ basic transforms

@policies
def test_value_and_grad(policy):
    ck = remat.checkpoint(block, policy=policy)
    args = block_args()
    close(ck(*args), block(*args))
    for argnums in (1, (0, 1, 2)):
        close(jax.value_and_grad(scalar(ck), argnums)(*args),
              jax.value_and_grad(scalar(block), argnums)(*args))


@policies
def test_vjp(policy):
    ck = remat.checkpoint(block, policy=policy)
    args = block_args()
    out, f_vjp = jax.vjp(ck, *args)
    out_ref, f_vjp_ref = jax.vjp(block, *args)
    close(out, out_ref)
    ct = rand(*out.shape)
    close(f_vjp(ct), f_vjp_ref(ct))
    close(f_vjp(2 * ct), f_vjp_ref(2 * ct))   # the VJP function is reusable


@policies
def test_jvp(policy):
    ck = remat.checkpoint(block, policy=policy)
    args = block_args()
    tangents = tuple(rand(*a.shape) for a in args)
    close(jax.jvp(ck, args, tangents), jax.jvp(block, args, tangents))


@policies
def test_linearize(policy):
    ck = remat.checkpoint(block, policy=policy)
    args = block_args()
    out, f_lin = jax.linearize(ck, *args)
    out_ref, f_lin_ref = jax.linearize(block, *args)
    close(out, out_ref)
    tangents = tuple(rand(*a.shape) for a in args)
    close(f_lin(*tangents), f_lin_ref(*tangents))
    close(jax.jit(f_lin)(*tangents), f_lin_ref(*tangents))


def test_vmap():
    ck = remat.checkpoint(block)
    w1, w2, _ = block_args()
    xs = rand(5, 2, 3)
    close(jax.vmap(ck, (None, None, 0))(w1, w2, xs),
          jax.vmap(block, (None, None, 0))(w1, w2, xs))
    # Gradients of a batched function.
    batched = lambda f: lambda w1, w2, xs: jax.vmap(f, (None, None, 0))(w1, w2, xs)
    close(jax.grad(scalar(batched(ck)), (0, 1, 2))(w1, w2, xs),
          jax.grad(scalar(batched(block)), (0, 1, 2))(w1, w2, xs))
    # Per-example gradients, batched along a non-leading axis, with batched weights.
    w1s = rand(5, 3, 4)
    close(jax.vmap(jax.grad(scalar(ck)), (0, None, 1))(w1s, w2, xs.transpose(1, 0, 2)),
          jax.vmap(jax.grad(scalar(block)), (0, None, 1))(
              w1s, w2, xs.transpose(1, 0, 2)))


@policies
def test_jit(policy):
    ck = remat.checkpoint(block, policy=policy)
    args = block_args()
    expected = jax.grad(scalar(block), (0, 1, 2))(*args)
    close(jax.jit(ck)(*args), block(*args))
    close(jax.jit(jax.grad(scalar(ck), (0, 1, 2)))(*args), expected)
    close(jax.grad(jax.jit(scalar(ck)), (0, 1, 2))(*args), expected)
    # A checkpoint inside jit inside a checkpoint.
    nested = remat.checkpoint(jax.jit(ck), policy=policy)
    close(jax.jit(jax.grad(scalar(nested), (0, 1, 2)))(*args), expected)


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_lowering_strategies_under_jit(lowering):
    ck = remat.checkpoint(block, lowering=lowering)
    args = block_args()
    grad_ck = jax.jit(jax.grad(scalar(ck), (0, 1, 2)))
    close(grad_ck(*args), jax.grad(scalar(block), (0, 1, 2))(*args))
    close(jax.jit(jax.value_and_grad(scalar(ck)))(*args),
          jax.value_and_grad(scalar(block))(*args))
    # The protection each strategy promises is in the compiled program.
    text = grad_ck.lower(*args).as_text()
    marker = {"cond": "stablehlo.if", "gate": "stablehlo.rng",
              "barrier": "stablehlo.optimization_barrier",
              "while": "stablehlo.while"}[lowering]
    assert marker in text
    # Forward-only use is inlined: no protection.
    fwd_text = jax.jit(ck).lower(*args).as_text()
    assert marker not in fwd_text


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_lowering_strategies_higher_order(lowering):
    f = lambda x: jnp.sin(jnp.sin(x)) * x
    ck = remat.checkpoint(f, lowering=lowering)
    x = rand(3)
    hess = jax.jit(jax.hessian(lambda x: jnp.sum(ck(x))))
    close(hess(x), jax.hessian(lambda x: jnp.sum(f(x)))(x))
    xs = rand(4, 3)
    vg = jax.jit(jax.vmap(jax.grad(lambda x: jnp.sum(ck(x)))))
    close(vg(xs), jax.vmap(jax.grad(lambda x: jnp.sum(f(x))))(xs))


# --------------------------------------------------------------- control flow

@pytest.mark.parametrize("prevent_cse", [False, True])
@policies
def test_scan_with_checkpointed_body(prevent_cse, policy):
    def body(c, x):
        c = jnp.tanh(c * x + jnp.sin(c))
        return c, jnp.cos(c) * x

    ck_body = remat.checkpoint(body, prevent_cse=prevent_cse, policy=policy)

    def loss(b, c, xs):
        c, ys = lax.scan(b, c, xs)
        return jnp.sum(c) + jnp.sum(ys ** 2)

    c, xs = rand(3), rand(4, 3)
    expected = jax.grad(partial(loss, body), (0, 1))(c, xs)
    close(jax.grad(partial(loss, ck_body), (0, 1))(c, xs), expected)
    close(jax.jit(jax.grad(partial(loss, ck_body), (0, 1)))(c, xs), expected)


def test_checkpoint_of_scan():
    def f(c, xs):
        c, ys = lax.scan(lambda c, x: (jnp.sin(c) * x, c * x), c, xs)
        return jnp.sum(c) + jnp.sum(ys)

    c, xs = rand(2), rand(3, 2)
    expected = jax.grad(f, (0, 1))(c, xs)
    close(jax.grad(remat.checkpoint(f), (0, 1))(c, xs), expected)
    close(jax.jit(jax.grad(remat.checkpoint(f), (0, 1)))(c, xs), expected)


def test_cond_inside_checkpoint():
    def f(p, x):
        return lax.cond(p, lambda x: jnp.sin(x) * x, lambda x: jnp.cos(x) ** 2, x)

    x = rand(3)
    for p in (True, False):
        g = lambda x: jnp.sum(remat.checkpoint(f)(p, x))
        close(jax.grad(g)(x), jax.grad(lambda x: jnp.sum(f(p, x)))(x))
        close(jax.jit(jax.grad(g))(x), jax.grad(lambda x: jnp.sum(f(p, x)))(x))


def test_checkpoint_inside_cond():
    inner = lambda x: jnp.sin(jnp.sin(x))
    ck = remat.checkpoint(inner)

    def f(g, p, x):
        return jnp.sum(lax.cond(p, g, jnp.cos, x))

    x = rand(3)
    for p in (True, False):
        close(jax.grad(partial(f, ck, p))(x), jax.grad(partial(f, inner, p))(x))
        close(jax.jit(jax.grad(partial(f, ck, p)))(x),
              jax.grad(partial(f, inner, p))(x))


def test_while_loop_forward_and_jvp():
    def f(x):
        def body(carry):
            i, y = carry
            return i + 1, jnp.sin(y) * 1.5
        return lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]

    ck = remat.checkpoint(f)
    x, t = rand(3), rand(3)
    close(ck(x), f(x))
    close(jax.jit(ck)(x), f(x))
    close(jax.jvp(ck, (x,), (t,)), jax.jvp(f, (x,), (t,)))
    close(jax.jacfwd(ck)(x), jax.jacfwd(f)(x))
    # Reverse mode through a while loop is an error in JAX, with or without remat.
    with pytest.raises(ValueError, match="Reverse-mode differentiation"):
        jax.grad(lambda x: jnp.sum(ck(x)))(x)


def test_checkpoint_inside_while_loop_body():
    ck = remat.checkpoint(lambda y: jnp.sin(y) * 1.5)

    def f(g, x):
        return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, g(c[1])),
                              (0, x))[1]

    x, t = rand(3), rand(3)
    close(jax.jvp(partial(f, ck), (x,), (t,)),
          jax.jvp(partial(f, lambda y: jnp.sin(y) * 1.5), (x,), (t,)))


# -------------------------------------------------------- custom derivatives

def test_custom_jvp_inside():
    @jax.custom_jvp
    def softplus(x):
        return jnp.log1p(jnp.exp(x))

    @softplus.defjvp
    def softplus_jvp(primals, tangents):
        x, = primals
        t, = tangents
        return softplus(x), t * jax.nn.sigmoid(x)

    def f(x):
        return jnp.sin(softplus(jnp.sin(x) * 2.))

    x = rand(4)
    g = lambda f: lambda x: jnp.sum(f(x))
    ck = remat.checkpoint(f)
    close(jax.grad(g(ck))(x), jax.grad(g(f))(x))
    close(jax.jit(jax.grad(g(ck)))(x), jax.grad(g(f))(x))
    close(jax.jvp(ck, (x,), (x,)), jax.jvp(f, (x,), (x,)))
    close(jax.hessian(g(ck))(x), jax.hessian(g(f))(x))


def test_custom_vjp_inside():
    @jax.custom_vjp
    def clip_grad(x):
        return jnp.sin(x)

    def fwd(x):
        return jnp.sin(x), jnp.cos(x)

    def bwd(cos_x, ct):
        return (jnp.clip(cos_x * ct, -0.5, 0.5),)

    clip_grad.defvjp(fwd, bwd)

    def f(x):
        return jnp.exp(clip_grad(x * 3.) * 0.5)

    x = rand(5)
    g = lambda f: lambda x: jnp.sum(f(x))
    ck = remat.checkpoint(f)
    close(jax.grad(g(ck))(x), jax.grad(g(f))(x))
    close(jax.jit(jax.grad(g(ck)))(x), jax.grad(g(f))(x))
    xs = rand(2, 5)
    close(jax.vmap(jax.grad(g(ck)))(xs), jax.vmap(jax.grad(g(f)))(xs))


# ---------------------------------------------------------- nesting, recursion

@pytest.mark.parametrize("lowering", [None, *LOWERINGS])
def test_nested_checkpoints(lowering):
    inner = remat.checkpoint(lambda x: jnp.sin(jnp.sin(x)), lowering=lowering)
    outer = remat.checkpoint(lambda x: jnp.cos(inner(x) * x), lowering=lowering,
                             policy=remat.checkpoint_policies.dots_saveable)
    plain = lambda x: jnp.cos(jnp.sin(jnp.sin(x)) * x)
    x = rand(4)
    g = lambda f: lambda x: jnp.sum(f(x))
    close(jax.grad(g(outer))(x), jax.grad(g(plain))(x))
    close(jax.jit(jax.grad(g(outer)))(x), jax.grad(g(plain))(x))
    close(jax.jit(jax.hessian(g(outer)))(x), jax.hessian(g(plain))(x))


def test_recursive_checkpoint():
    # Binomial-style recursion: a checkpoint of a function calling checkpointed
    # halves, down to single layers.
    layers = [lambda x, i=i: jnp.sin(x * (1. + 0.1 * i)) for i in range(6)]

    def compose(fs):
        def composed(x):
            for f in fs:
                x = f(x)
            return x
        return composed

    def checkpointed(fs):
        if len(fs) == 1:
            return remat.checkpoint(fs[0])
        half = len(fs) // 2
        left, right = checkpointed(fs[:half]), checkpointed(fs[half:])
        return remat.checkpoint(lambda x: right(left(x)))

    ck, plain = checkpointed(layers), compose(layers)
    x = rand(3)
    g = lambda f: lambda x: jnp.sum(f(x))
    close(ck(x), plain(x))
    close(jax.grad(g(ck))(x), jax.grad(g(plain))(x))
    close(jax.jit(jax.grad(g(ck)))(x), jax.grad(g(plain))(x))


# ---------------------------------------------------------- higher-order AD

@policies
def test_higher_order(policy):
    f = lambda x: jnp.sum(jnp.sin(x) * jnp.exp(jnp.tanh(x) * x[::-1]))
    ck = remat.checkpoint(f, policy=policy)
    x = rand(3)
    # grad of grad: the gradient's first component, differentiated again.
    close(jax.grad(lambda x: jax.grad(ck)(x)[0])(x),
          jax.grad(lambda x: jax.grad(f)(x)[0])(x))
    close(jax.jacfwd(jax.grad(ck))(x), jax.jacfwd(jax.grad(f))(x))
    close(jax.hessian(ck)(x), jax.hessian(f)(x))
    close(jax.jit(jax.hessian(ck))(x), jax.hessian(f)(x))
    # Third order, scalar in and out.
    s = lambda y: f(x * y)
    sc = lambda y: ck(x * y)
    close(jax.grad(jax.grad(jax.grad(sc)))(0.7), jax.grad(jax.grad(jax.grad(s)))(0.7),
          rtol=1e-5)


# ------------------------------------------------------- arguments and outputs

def test_pytree_inputs_and_outputs():
    def f(params, batch):
        h = jnp.tanh(batch["x"] @ params["w"] + params["b"])
        return {"out": h * batch["y"][:, None], "aux": (jnp.sum(h), params["b"] * 2)}

    params = {"w": rand(3, 2), "b": rand(2)}
    batch = {"x": rand(4, 3), "y": rand(4)}
    ck = remat.checkpoint(f)
    close(ck(params, batch), f(params, batch))

    def loss(f):
        def l(params, batch):
            o = f(params, batch)
            return jnp.sum(o["out"] ** 2) + o["aux"][0] + jnp.sum(o["aux"][1])
        return l
    close(jax.grad(loss(ck), (0, 1))(params, batch),
          jax.grad(loss(f), (0, 1))(params, batch))
    close(jax.jit(jax.grad(loss(ck), (0, 1)))(params, batch),
          jax.grad(loss(f), (0, 1))(params, batch))


def test_kwargs():
    def f(x, *, scale, shift=0.):
        return jnp.sin(x * scale) + shift

    ck = remat.checkpoint(f)
    x, scale, shift = rand(3), rand(3), rand(3)
    close(ck(x, scale=scale), f(x, scale=scale))
    g = lambda f: lambda x, scale, shift: jnp.sum(f(x, scale=scale, shift=shift) ** 2)
    close(jax.grad(g(ck), (0, 1, 2))(x, scale, shift),
          jax.grad(g(f), (0, 1, 2))(x, scale, shift))
    close(jax.jit(jax.grad(g(ck), (0, 1, 2)))(x, scale, shift),
          jax.grad(g(f), (0, 1, 2))(x, scale, shift))


def test_integer_inputs():
    def f(x, n, idx):
        return jnp.sin(x) ** 2 * n + x[idx]

    ck = remat.checkpoint(f)
    x, idx = rand(4), jnp.array([2, 0, 1, 3])
    g = lambda f: lambda x, n: jnp.sum(f(x, n, idx))
    close(jax.grad(g(ck))(x, 3), jax.grad(g(f))(x, 3))
    close(jax.jit(jax.grad(g(ck)))(x, 3), jax.grad(g(f))(x, 3))
    # The integer argument's cotangent is float0, as for the plain function.
    grads = jax.grad(g(ck), (0, 1), allow_int=True)(x, 3)
    grads_ref = jax.grad(g(f), (0, 1), allow_int=True)(x, 3)
    assert grads[1].dtype == grads_ref[1].dtype == jax.dtypes.float0
    close(grads[0], grads_ref[0])
    # Batched integer arguments.
    xs, ns = rand(2, 4), jnp.array([1, 3])
    close(jax.vmap(jax.grad(g(ck)))(xs, ns), jax.vmap(jax.grad(g(f)))(xs, ns))


def test_integer_outputs():
    def f(x):
        return jnp.sin(x), jnp.argmax(x), (x > 0).astype(jnp.int32)

    ck = remat.checkpoint(f)
    x = rand(5)
    close(ck(x), f(x))
    out, f_vjp = jax.vjp(ck, x)
    out_ref, f_vjp_ref = jax.vjp(f, x)
    close(out, out_ref)
    cts = (rand(5), np.zeros((), jax.dtypes.float0), np.zeros((5,), jax.dtypes.float0))
    close(f_vjp(cts), f_vjp_ref(cts))
    close(jax.jvp(ck, (x,), (x,))[1][0], jax.jvp(f, (x,), (x,))[1][0])


def test_outputs_independent_of_inputs():
    def f(x):
        return jnp.sin(x), jnp.ones(3) * 2., jnp.arange(3.)

    ck = remat.checkpoint(f)
    x = rand(3)
    close(ck(x), f(x))
    g = lambda f: lambda x: sum(jnp.sum(o ** 2) for o in f(x))
    close(jax.grad(g(ck))(x), jax.grad(g(f))(x))
    close(jax.jit(jax.grad(g(ck)))(x), jax.grad(g(f))(x))
    tangents = jax.jvp(ck, (x,), (x,))[1]
    close(tangents, jax.jvp(f, (x,), (x,))[1])
    # Nothing depends on the input at all.
    const = remat.checkpoint(lambda x: jnp.ones(2) * 3.)
    close(jax.grad(lambda x: jnp.sum(const(x)) + x)(1.5), 1.)
    close(jax.jit(jax.grad(lambda x: jnp.sum(const(x)) * x))(1.5), 6.)


def test_output_is_an_input():
    f = lambda x, y: (x, jnp.sin(y) * x, y)
    ck = remat.checkpoint(f)
    x, y = rand(3), rand(3)
    g = lambda f: lambda x, y: sum(jnp.sum(o ** 2) for o in f(x, y))
    close(jax.grad(g(ck), (0, 1))(x, y), jax.grad(g(f), (0, 1))(x, y))
    close(jax.jit(jax.grad(g(ck), (0, 1)))(x, y), jax.grad(g(f), (0, 1))(x, y))


def test_closed_over_values():
    def loss(f, w, x):
        return jnp.sum(f(w, x) ** 2)

    def outer(w, x):
        scale = jnp.cos(w).sum()   # a traced value closed over by the checkpoint
        return remat.checkpoint(lambda x: jnp.sin(x * scale) * w)(x)

    def plain(w, x):
        return jnp.sin(x * jnp.cos(w).sum()) * w

    w, x = rand(3), rand(3)
    close(jax.grad(partial(loss, outer), (0, 1))(w, x),
          jax.grad(partial(loss, plain), (0, 1))(w, x))
    close(jax.jit(jax.grad(partial(loss, outer), (0, 1)))(w, x),
          jax.grad(partial(loss, plain), (0, 1))(w, x))


@pytest.mark.parametrize("prevent_cse", [(True, False), (False, True), [True, True]])
def test_prevent_cse_per_argument(prevent_cse):
    f = lambda w, x: jnp.sin(jnp.sin(x * w))
    ck = remat.checkpoint(f, prevent_cse=prevent_cse)
    w, x = rand(3), rand(3)
    g = lambda f: lambda w, x: jnp.sum(f(w, x))
    close(jax.jit(jax.grad(g(ck), (0, 1)))(w, x), jax.grad(g(f), (0, 1))(w, x))
    close(jax.jit(jax.hessian(g(ck)))(w, x), jax.hessian(g(f))(w, x))


def test_static_argnums_with_transforms():
    def f(x, n, mode):
        for _ in range(n):
            x = jnp.sin(x) if mode == "sin" else jnp.cos(x)
        return x

    ck = remat.checkpoint(f, static_argnums=(1, 2))
    x = rand(3)
    for n, mode in [(2, "sin"), (3, "cos")]:
        g = lambda f: lambda x: jnp.sum(f(x, n, mode))
        close(jax.grad(g(ck))(x), jax.grad(g(f))(x))
        close(jax.jit(jax.grad(g(ck)))(x), jax.grad(g(f))(x))
        xs = rand(2, 3)
        close(jax.vmap(ck, (0, None, None))(xs, n, mode),
              jax.vmap(f, (0, None, None))(xs, n, mode))


def test_bfloat16_residuals():
    # Residuals are rounded to their dtype, so the recomputation sees the values
    # the forward pass stored: the gradient matches the plain function's.
    f = lambda x: jnp.sin(jnp.exp(x) * x) * x
    ck = remat.checkpoint(f, policy=remat.checkpoint_policies.everything_saveable)
    ck_none = remat.checkpoint(f)
    x = rand(8).astype(jnp.bfloat16)
    g = lambda f: lambda x: jnp.sum(f(x).astype(jnp.float32))
    expected = jax.jit(jax.grad(g(f)))(x)
    close(jax.jit(jax.grad(g(ck)))(x).astype(jnp.float32),
          expected.astype(jnp.float32), rtol=1e-2, atol=1e-2)
    close(jax.jit(jax.grad(g(ck_none)))(x).astype(jnp.float32),
          expected.astype(jnp.float32), rtol=1e-2, atol=1e-2)


def _excess_precision_program(ck):
    """A bf16 product whose exact value is not a bf16 number, saved by a custom_vjp
    whose backward returns the saved value: forward and backward must agree."""
    @jax.custom_vjp
    def square(x):
        return jnp.dot(x, x)
    square.defvjp(lambda x: (square(x), None), lambda _, g: (g,))

    @jax.custom_vjp
    def widen(x):
        return jnp.float32(1.) * x.astype(jnp.float32)
    widen.defvjp(lambda x: (widen(x), x),
                 lambda x, _: (jnp.float32(1.) * x.astype(jnp.float32),))

    return jax.jit(ck(lambda x: widen(square(x)),
                      policy=remat.checkpoint_policies.everything_saveable))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_residuals_are_rounded_in_both_passes(dtype):
    # (1 + eps)^2 is not representable; XLA may keep it wider when it stays in
    # registers. The saved value, its forward use and the backward's copy of it
    # must all be the rounded one, bit for bit, as with jax.checkpoint.
    x = (dtype(1) + jnp.finfo(dtype).eps) * jnp.eye(2, dtype=dtype)
    results = {}
    for name, ck in [("remat", remat.checkpoint), ("jax", jax.checkpoint)]:
        y, vjp = jax.vjp(_excess_precision_program(ck), x)
        results[name] = (np.asarray(y), np.asarray(vjp(jnp.ones_like(y))[0]))
    y, ct = results["remat"]
    np.testing.assert_array_equal(y, ct.astype(np.float32))
    np.testing.assert_array_equal(y, results["jax"][0])
    np.testing.assert_array_equal(ct, results["jax"][1])
    if dtype == jnp.bfloat16:
        assert y[0, 0] == 1.015625


@pytest.mark.parametrize("lowering", LOWERINGS)
def test_effects_inside_checkpoint(lowering, capfd):
    def f(x):
        jax.debug.print("value {}", x[0], ordered=True)
        return jnp.sin(jnp.sin(x))

    ck = remat.checkpoint(f, lowering=lowering)
    x = rand(3)
    g = jax.jit(jax.grad(lambda x: jnp.sum(ck(x))))
    close(g(x), jax.grad(lambda x: jnp.sum(jnp.sin(jnp.sin(x))))(x))
    jax.effects_barrier()
    # Once in the forward pass and once in the recomputation, as jax.checkpoint.
    assert capfd.readouterr().out.count("value") == 2


def test_refs_inside_checkpoint():
    # A region that writes a Ref it closes over or receives lowers under jit (the
    # Ref is discharged into a value threaded through the region), as with
    # jax.checkpoint. (Differentiating through Refs fails in JAX itself.)
    def closure(ck, x):
        r = jax.new_ref(jnp.zeros(3))

        def body(x):
            r[...] = jnp.sin(x) * x
            return jnp.cos(x)

        return jnp.sum(ck(body)(x) * r[...])

    def argument(ck, x):
        r = jax.new_ref(jnp.ones(3))

        def body(r, x):
            r[...] += jnp.sin(x)
            return jnp.cos(x)

        return ck(body)(r, x) + r[...]

    x = rand(3)
    for fun in (closure, argument):
        expected = jax.jit(partial(fun, jax.checkpoint))(x)
        close(jax.jit(partial(fun, remat.checkpoint))(x), expected)
        close(partial(fun, remat.checkpoint)(x), expected)
        xs = rand(2, 3)
        close(jax.jit(jax.vmap(partial(fun, remat.checkpoint)))(xs),
              jax.vmap(partial(fun, jax.checkpoint))(xs))


# ----------------------------------------------- more JAX features inside/around

def _sum_of(f):
    return lambda *a: jnp.sum(f(*a))


def test_mixed_with_jax_checkpoint():
    inner_fn = lambda w, h: jnp.tanh(h @ w)
    plain = lambda w, x: jnp.sum(jnp.sin(inner_fn(w, x) @ w) * x)
    jax_in_remat = remat.checkpoint(
        lambda w, x: jnp.sum(jnp.sin(jax.checkpoint(inner_fn)(w, x) @ w) * x))
    remat_in_jax = jax.checkpoint(
        lambda w, x: jnp.sum(jnp.sin(remat.checkpoint(inner_fn)(w, x) @ w) * x),
        policy=jax.checkpoint_policies.dots_saveable)
    w, x = rand(3, 3), rand(3)
    for mixed in (jax_in_remat, remat_in_jax):
        close(jax.jit(jax.grad(mixed, (0, 1)))(w, x), jax.grad(plain, (0, 1))(w, x))
        close(jax.hessian(mixed, 1)(w, x), jax.hessian(plain, 1)(w, x))


def test_shard_map():
    mesh = jax.make_mesh((1,), ("d",))
    spec = jax.sharding.PartitionSpec()
    f = lambda a: jnp.sin(jnp.sin(a)) * a
    inside = jax.shard_map(remat.checkpoint(f), mesh=mesh, in_specs=spec,
                           out_specs=spec)
    outside = remat.checkpoint(jax.shard_map(f, mesh=mesh, in_specs=spec,
                                             out_specs=spec))
    x = rand(4)
    for g in (inside, outside):
        close(jax.jit(jax.grad(_sum_of(g)))(x), jax.grad(_sum_of(f))(x))


def test_collectives_under_vmap():
    f = lambda a: jnp.sin(a) * lax.psum(a, "i")
    ck = remat.checkpoint(f)
    x = rand(4)
    close(jax.jit(jax.vmap(jax.grad(_sum_of(ck)), axis_name="i"))(x),
          jax.vmap(jax.grad(_sum_of(f)), axis_name="i")(x))
    batched = lambda g: lambda xs: jnp.sum(jax.vmap(g, axis_name="i")(xs))
    close(jax.jit(jax.grad(batched(ck)))(x), jax.grad(batched(f))(x))


def test_linear_transpose_of_linearized():
    f = lambda a: jnp.sin(jnp.sin(a)) * a
    x = rand(4)
    _, f_lin = jax.linearize(remat.checkpoint(f), x)
    close(jax.linear_transpose(f_lin, x)(x), jax.vjp(f, x)[1](x))


def test_has_aux_and_typed_keys():
    def f(a, key):
        noise = jax.random.normal(key, a.shape)
        return jnp.sum(jnp.sin(a) * noise), {"noise": noise}

    x, key = rand(3), jax.random.key(3)
    got = jax.jit(jax.grad(remat.checkpoint(f), has_aux=True))(x, key)
    close(got, jax.grad(f, has_aux=True)(x, key))
    keys = jax.random.split(key, 2)
    close(jax.vmap(jax.grad(remat.checkpoint(f), has_aux=True), (None, 0))(x, keys),
          jax.vmap(jax.grad(f, has_aux=True), (None, 0))(x, keys))


def test_custom_derivative_variants():
    @partial(jax.custom_vjp, nondiff_argnums=(0,))
    def apply(fn, a):
        return fn(a)

    apply.defvjp(lambda fn, a: (fn(a), a),
                 lambda fn, a, g: (jax.vjp(fn, a)[1](g)[0] * 2,))

    @jax.custom_jvp
    def mul(a, b):
        return a * b

    @partial(mul.defjvp, symbolic_zeros=True)
    def mul_jvp(primals, tangents):
        (a, b), (ta, tb) = primals, tangents
        out = jnp.zeros_like(a * b)
        if type(ta) is not jax.custom_derivatives.SymbolicZero:
            out = out + ta * b
        if type(tb) is not jax.custom_derivatives.SymbolicZero:
            out = out + a * tb
        return mul(a, b), out

    f = lambda a, b: jnp.sum(apply(jnp.sin, mul(a, lax.stop_gradient(b)) * 2.))
    x, y = rand(4), rand(4)
    ck = remat.checkpoint(f)
    close(jax.jit(jax.grad(ck, (0, 1)))(x, y), jax.grad(f, (0, 1))(x, y))
    close(jax.grad(ck)(x, y), jax.grad(f)(x, y))


# ------------------------------------------------------ random programs (hypothesis)

_STEPS = [
    lambda i, h, w, x: jnp.sin(h),
    lambda i, h, w, x: jnp.tanh(h) * x,
    lambda i, h, w, x: h @ w,
    lambda i, h, w, x: remat.checkpoint_name(h * 1.5, f"n{i % 3}"),
    lambda i, h, w, x: jnp.cos(h) + h,
    lambda i, h, w, x: jnp.einsum("i,ij->j", h, w) * jnp.sum(x),
]
_RANDOM_POLICIES = [
    None, remat.checkpoint_policies.dots_saveable,
    remat.checkpoint_policies.everything_saveable,
    remat.checkpoint_policies.save_only_these_names("n0", "n2"),
    remat.checkpoint_policies.save_any_names_but_these("n1"),
    remat.checkpoint_policies.save_anything_except_these_names("n0"),
]


def _program(steps, checkpointed: bool):
    """Composes ``steps`` (step, wrap, policy, prevent_cse); when ``checkpointed``,
    the prefix ending at each step with ``wrap`` set becomes a nested checkpoint."""
    fn = lambda h, w, x: h
    for i, (step, wrap, policy, cse) in enumerate(steps):
        fn = partial(lambda prev, i, step, h, w, x: _STEPS[step](i, prev(h, w, x), w, x),
                     fn, i, step)
        if checkpointed and wrap:
            fn = remat.checkpoint(fn, policy=_RANDOM_POLICIES[policy], prevent_cse=cse)
    return fn


def test_random_programs():
    from hypothesis import HealthCheck, given, settings, strategies as st

    steps = st.lists(st.tuples(st.integers(0, len(_STEPS) - 1), st.booleans(),
                               st.integers(0, len(_RANDOM_POLICIES) - 1),
                               st.booleans()), min_size=1, max_size=5)

    @settings(max_examples=8, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(steps, st.sampled_from([None, *LOWERINGS]), st.booleans())
    def check(program, lowering, use_jit):
        ck = remat.checkpoint(_program(program, True), lowering=lowering)
        plain = _program(program, False)
        grad = lambda f: jax.grad(lambda *a: jnp.sum(f(*a)), (0, 1, 2))
        args = rand(3), rand(3, 3) * 0.5, rand(3)
        got = (jax.jit(grad(ck)) if use_jit else grad(ck))(*args)
        close(got, grad(plain)(*args))

    check()

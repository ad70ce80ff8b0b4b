"""Every way ``remat.checkpoint`` can be misused, and its tracing cache: what is
rejected (with which message), what is accepted, and when the function is
traced again."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat


def scale(x, n):
    return x * n


# ------------------------------------------------------------ static_argnums

@pytest.mark.parametrize("bad", [1.5, "1", True, None, (0, "1"), (0, 1.0), [True],
                                 np.int64(1), range(1, 2)])
def test_static_argnums_wrong_type(bad):
    with pytest.raises(TypeError, match="static_argnums must be an int or a tuple "
                                        "of ints"):
        remat.checkpoint(scale, static_argnums=bad)


@pytest.mark.parametrize("good", [1, -1, (1,), [1], (1, -1)])
def test_static_argnums_accepted_forms(good):
    ck = remat.checkpoint(scale, static_argnums=good)
    assert ck(2., 3) == 6.
    assert jax.grad(ck)(2., 3) == 3.


@pytest.mark.parametrize("argnum", [2, 5, -3])
def test_static_argnums_out_of_range(argnum):
    ck = remat.checkpoint(scale, static_argnums=argnum)
    with pytest.raises(ValueError, match=rf"contains {argnum}.*called with 2 "
                                         r"positional argument.*-2\.\.1"):
        ck(2., 3)


def test_static_argnums_given_by_keyword():
    # Static values must be positional; by keyword, position 1 does not exist.
    ck = remat.checkpoint(scale, static_argnums=1)
    with pytest.raises(ValueError, match=r"valid positions are -1\.\.0.*"
                                         r"Pass static values positionally"):
        ck(2., n=3)


@pytest.mark.parametrize("outer", [jax.jit, jax.grad, jax.vmap],
                         ids=["jit", "grad", "vmap"])
def test_traced_value_as_static_arg(outer):
    ck = remat.checkpoint(scale, static_argnums=1)
    with pytest.raises(TypeError, match=r"argument 1 is marked static but is a "
                                        r"traced array \(float32\[\]\)"):
        outer(lambda n: ck(2., n))(jnp.ones(()) if outer is not jax.vmap
                                   else jnp.ones(2))


def test_unhashable_static_args_cached_by_identity():
    traces = 0

    def f(x, cfg):
        nonlocal traces
        traces += 1
        return x * cfg["scale"] + len(cfg["layers"])

    ck = remat.checkpoint(f, static_argnums=1)
    cfg = {"scale": 2., "layers": [1, 2]}
    for _ in range(3):
        assert ck(1., cfg) == 4.
    assert jax.grad(ck)(1., cfg) == 2.
    assert traces == 1          # the same object: traced once
    equal_copy = {"scale": 2., "layers": [1, 2]}
    assert ck(1., equal_copy) == 4.
    assert traces == 2          # an equal but distinct object: by identity
    assert ck(1., cfg) == 4.
    assert traces == 2          # the first is still cached
    # A mutated object is not noticed: identity is the key (as with jax.checkpoint).
    cfg["scale"] = 5.
    assert ck(1., cfg) == 4.


def test_unhashable_static_array():
    traces = 0

    def f(x, table):
        nonlocal traces
        traces += 1
        return x * float(table.sum())

    ck = remat.checkpoint(f, static_argnums=(1,))
    table = np.arange(3.)
    assert ck(2., table) == 6.
    assert ck(2., table) == 6.
    assert jax.jit(lambda x: ck(x, table))(2.) == 6.
    assert traces == 1


def test_hashable_static_args_cached_by_value_and_type():
    traces = 0

    def f(x, n, mode):
        nonlocal traces
        traces += 1
        return x * n if mode == "mul" else x + n

    ck = remat.checkpoint(f, static_argnums=(1, 2))
    assert ck(2., 3, "mul") == 6.
    assert ck(5., 3, "mul") == 15.
    assert ck(2., int("3"), "m" + "ul") == 6.   # equal values: cached
    assert traces == 1
    assert ck(2., 3, "add") == 5.
    assert traces == 2
    assert ck(2., 3.0, "mul") == 6.               # 3.0 == 3 but another type
    assert traces == 3


# ----------------------------------------------------------- static_argnames

def layer(x, mode="sin", *, n=1):
    for _ in range(n):
        x = jnp.sin(x) if mode == "sin" else jnp.cos(x)
    return x


@pytest.mark.parametrize("names", [("mode", "n"), ["n", "mode"], {"n", "mode"}])
def test_static_argnames_by_keyword_and_position(names):
    ck = remat.checkpoint(layer, static_argnames=names)
    x = jnp.float32(0.3)
    for call in [lambda f, x: f(x, mode="cos", n=2), lambda f, x: f(x, "cos", n=2),
                 lambda f, x: f(x, "sin")]:
        np.testing.assert_allclose(call(ck, x), call(layer, x), rtol=1e-6)
        np.testing.assert_allclose(jax.grad(lambda x: call(ck, x))(x),
                                   jax.grad(lambda x: call(layer, x))(x), rtol=1e-6)


def test_static_argnums_and_argnames_together():
    ck = remat.checkpoint(layer, static_argnums=1, static_argnames="n")
    x = jnp.float32(0.3)
    for mode, n in [("cos", 2), ("sin", 3)]:
        want = jax.grad(lambda x: layer(x, mode, n=n))(x)
        np.testing.assert_allclose(jax.grad(lambda x: ck(x, mode, n=n))(x), want,
                                   rtol=1e-6)
        np.testing.assert_allclose(jax.jit(jax.grad(lambda x: ck(x, mode, n=n)))(x),
                                   want, rtol=1e-6)


def test_unhashable_static_argname_closed_over_by_identity():
    traces = 0

    def f(x, *, cfg):
        nonlocal traces
        traces += 1
        return jnp.sin(x) * cfg["scale"] if cfg["act"] == "sin" else x

    ck = remat.checkpoint(f, static_argnames="cfg")
    cfg = {"scale": 3., "act": "sin"}
    assert jax.grad(ck)(0., cfg=cfg) == 3.
    assert jax.grad(ck)(0., cfg=cfg) == 3.
    assert traces == 1
    assert ck(0., cfg={"scale": 3., "act": "id"}) == 0.
    assert traces == 2


def test_static_argnames_with_var_keyword_take_any_name():
    ck = remat.checkpoint(lambda x, **kw: x * kw["a"] if kw["on"] else x,
                          static_argnames=("a", "on"))
    assert jax.grad(ck)(1., a=2., on=True) == 2.


@pytest.mark.parametrize("bad", [1, (1,), ("mode", 2), None, b"mode"])
def test_static_argnames_wrong_type(bad):
    with pytest.raises(TypeError, match=r"static_argnames must be a str or a "
                                        r"sequence of str .*got"):
        remat.checkpoint(layer, static_argnames=bad)


@pytest.mark.parametrize("fun, bad", [(layer, "nope"), (layer, ("n", "modes")),
                                      (lambda x, m, /: x, "m")])
def test_static_argnames_not_a_parameter(fun, bad):
    with pytest.raises(ValueError, match=r"invalid argnames \['(nope|modes|m)'\] in "
                                         r"static_argnames.*takes no argument of that "
                                         r"name"):
        remat.checkpoint(fun, static_argnames=bad)


def test_traced_value_as_static_argname():
    ck = remat.checkpoint(layer, static_argnames="n")
    with pytest.raises(TypeError, match=r"argument 'n' is marked static but is a "
                                        r"traced array"):
        jax.jit(lambda n: ck(1., n=n))(2)


# ---------------------------------------------------------------- outputs

@pytest.mark.parametrize("out, where", [
    (lambda x: "hello", r"type str \('hello'\)"),
    (lambda x: (x, "s"), r"type str at output \[1\]"),
    (lambda x: {"a": x, "b": object()}, r"type object at output \['b'\]")])
def test_non_array_output_is_named(out, where):
    with pytest.raises(TypeError, match=r"remat.checkpoint: the function <lambda> at "
                                        rf".*returned a value of {where}.*not a valid JAX "
                                        r"type.*arrays, scalars, or pytrees"):
        remat.checkpoint(out)(1.)


def test_changing_an_argument_is_refused():
    # The change would be lost (remat.checkpoint returns only the results), as it
    # silently is under jax.checkpoint: a dropout stream's count, a statistic.
    def fills(cache, x):
        cache["y"] = x * 2
        return x

    with pytest.raises(ValueError, match=r"changed its arguments \(argument leaf "
                                         r"\[0\]\['y'\]\) and did not return.*"
                                         r"remat\.nnx\.remat"):
        remat.checkpoint(fills)({"x": jnp.ones(2)}, jnp.ones(2))

    def swaps(state, x):
        state["x"] = state["x"] + 1.0
        return x * state["x"]

    with pytest.raises(ValueError, match=r"changed its arguments \(argument leaf "
                                         r"\[0\]\['x'\]\)"):
        remat.checkpoint(swaps)({"x": jnp.ones(2)}, jnp.ones(2))

    def returns(state, x):      # the new value is returned: nothing is lost
        state["x"] = state["x"] + 1.0
        return x * state["x"], state["x"]

    np.testing.assert_allclose(remat.checkpoint(returns)({"x": jnp.ones(2)}, jnp.ones(2))[1],
                               [2.0, 2.0])
    reads = remat.checkpoint(lambda state, x: x * state["x"])
    np.testing.assert_allclose(jax.grad(lambda x: reads({"x": jnp.full(2, 3.0)}, x).sum())(
        jnp.ones(2)), [3.0, 3.0])


def test_none_output_is_an_empty_pytree():
    assert remat.checkpoint(lambda x: (x, None))(1.) == (1., None)


def test_no_retracing_for_same_shapes():
    traces = 0

    def f(x, y):
        nonlocal traces
        traces += 1
        return jnp.sin(x) * y

    ck = remat.checkpoint(f)
    x, y = jnp.ones(3), jnp.ones(3)
    for _ in range(3):
        ck(x, y)
        ck(x + 1., y * 2.)          # new values, same shapes
    jax.jit(ck)(x, y)             # inside other transformations the checkpointed
    jax.grad(lambda x: ck(x, y).sum())(x)          # function sees the same avals
    jax.vmap(ck)(jnp.ones((2, 3)), jnp.ones((2, 3)))
    assert traces == 1
    ck(jnp.ones(4), jnp.ones(4))  # a new shape
    assert traces == 2
    ck(jnp.ones(3, jnp.int32), jnp.ones(3))   # a new dtype
    assert traces == 3
    ck(x, y)
    assert traces == 3


def test_retracing_for_pytree_structure_and_kwargs():
    traces = 0

    def f(x, **kw):
        nonlocal traces
        traces += 1
        return sum(jax.tree_util.tree_leaves(x)) + sum(kw.values())

    ck = remat.checkpoint(f)
    ck((1., 2.))
    ck((3., 4.))
    assert traces == 1
    ck([1., 2.])                  # another container type
    assert traces == 2
    ck((1., 2.), a=1.)
    ck((5., 6.), a=2.)
    assert traces == 3
    ck((1., 2.), b=1.)            # another keyword
    assert traces == 4


def test_concretization_error_mentions_static_argnums():
    @remat.checkpoint
    def f(x, flag):
        return jnp.sin(x) if flag > 0 else jnp.cos(x)

    with pytest.raises(jax.errors.ConcretizationTypeError,
                       match=r"(?s)static_argnums=\(i,\)"):
        f(1., 1)
    with pytest.raises(jax.errors.ConcretizationTypeError, match="static_argnums"):
        jax.grad(f)(1., 1)
    # The fix the message suggests works.
    g = remat.checkpoint(f.__wrapped__, static_argnums=1)
    assert g(1., 1) == jnp.sin(1.)
    assert g(1., -1) == jnp.cos(1.)


def test_concretization_error_for_shapes():
    f = remat.checkpoint(lambda x, n: x * jnp.ones(n))
    with pytest.raises(TypeError, match="static_argnums"):
        f(2., 3)
    assert remat.checkpoint(lambda x, n: x * jnp.ones(n), static_argnums=1)(
        2., 3).shape == (3,)


# -------------------------------------------------------------- other options

@pytest.mark.parametrize("bad", ["fast", "COND", "", 1, True])
def test_bad_lowering(bad):
    with pytest.raises(ValueError, match=r"lowering must be one of \('barrier', "
                                         r"'cond', 'gate', 'while'\) or None"):
        remat.checkpoint(scale, lowering=bad)


@pytest.mark.parametrize("bad", ["dots_saveable", 1, (None,), True])
def test_bad_policy_type(bad):
    with pytest.raises(TypeError, match="policy must be callable as "
                                        r"policy\(prim, \*avals, \*\*params\)"):
        remat.checkpoint(scale, policy=bad)


@pytest.mark.parametrize("bad", ["yes", 1, None, 0.0, (True, "no"), (1, 0)])
def test_bad_prevent_cse_type(bad):
    with pytest.raises(TypeError, match="prevent_cse must be a bool or a tuple of "
                                        "bools"):
        remat.checkpoint(scale, prevent_cse=bad)


def test_prevent_cse_length_mismatch():
    ck = remat.checkpoint(scale, prevent_cse=(True,))
    with pytest.raises(ValueError, match=r"prevent_cse has 1 entries but the "
                                         r"function was called with 2 positional"):
        ck(2., 3.)
    # Static arguments count as positions too.
    ck = remat.checkpoint(scale, prevent_cse=(True, False), static_argnums=1)
    assert jax.grad(ck)(2., 3) == 3.


def test_fun_not_callable():
    with pytest.raises(TypeError, match="fun must be callable, got 3"):
        remat.checkpoint(3)


def test_checkpoint_name_requires_str():
    with pytest.raises(TypeError, match="name must be a str, got 3"):
        remat.checkpoint_name(jnp.ones(2), 3)


def test_non_array_argument():
    with pytest.raises(TypeError, match="not a valid JAX type"):
        remat.checkpoint(scale)("a", 2.)


def test_grad_of_non_differentiable_output_is_an_error():
    # Errors from JAX itself pass through unchanged.
    ck = remat.checkpoint(lambda x: jnp.argmax(x))
    with pytest.raises(TypeError, match="grad requires real-valued outputs"):
        jax.grad(ck)(jnp.ones(3))


def test_errors_inside_the_function_propagate():
    def f(x):
        raise RuntimeError("boom")

    ck = remat.checkpoint(f)
    with pytest.raises(RuntimeError, match="boom"):
        ck(1.)
    with pytest.raises(RuntimeError, match="boom"):
        jax.grad(ck)(1.)


def test_wrapper_keeps_name_and_docstring():
    def my_layer(x):
        """Docs."""
        return x

    ck = remat.checkpoint(my_layer)
    assert ck.__name__ == "my_layer"
    assert ck.__doc__ == "Docs."
    assert partial(remat.remat, static_argnums=0)(my_layer).__wrapped__ is my_layer


@pytest.mark.parametrize("bad", [((True,), True), ((True, False, True), False),
                                 (True, (True, False)), ({"a": True}, True)])
def test_prevent_cse_structure_mismatch(bad):
    ck = remat.checkpoint(lambda t, y: jnp.sin(t[0] * t[1]) * y, prevent_cse=bad)
    with pytest.raises(ValueError, match=r"prevent_cse entry .* for positional "
                                         r"argument \d does not match"):
        ck((1., 2.), 3.)


def test_prevent_cse_pytree_entries():
    def f(params, x):
        return jnp.sin(params["w"] * x) + params["b"][0] * params["b"][1]

    params = {"w": 2., "b": (3., 4.)}
    expected = jax.grad(f)(params, 1.5)
    # Per-leaf flags with the argument's structure, or a prefix of it.
    for flags in [({"w": True, "b": (False, True)}, False),
                  ({"w": True, "b": False}, True)]:
        ck = remat.checkpoint(f, prevent_cse=flags)
        jaxpr = jax.make_jaxpr(ck)(params, 1.5)
        eqn, = jaxpr.jaxpr.eqns
        assert len(eqn.params["prevent_cse"]) == len(eqn.invars)
        got = jax.jit(jax.grad(ck))(params, 1.5)
        jax.tree_util.tree_map(np.testing.assert_allclose, got, expected)

"""A call split as jax.jit splits it: static and donated arguments by position or
name, non-array leaves static, and one key for calls that give one program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat._jax.call import CallSpec, CallSplit, OutputTree, is_dynamic


def _step(w, x, act="tanh", *, scale=1.0):
    return w * x * scale


def test_positions_and_names_complete_each_other_from_the_signature():
    spec = CallSpec.of(_step, {"static_argnums": 2, "donate_argnames": "w"})
    assert spec.static_argnums == {2} and spec.static_argnames == {"act"}
    assert spec.donate_argnums == {0} and spec.donate_argnames == {"w"}
    negative = CallSpec.of(_step, {"static_argnums": -1})
    assert negative.static_argnames == {"act"}


def test_the_jit_arguments_it_reads_are_taken_out_and_the_rest_left():
    kwargs = {"static_argnums": (2,), "in_shardings": None, "out_shardings": None}
    CallSpec.of(_step, kwargs)
    assert kwargs == {"out_shardings": None}


@pytest.mark.parametrize("kwargs, message", [
    ({"static_argnums": "act"}, "an int or ints"),
    ({"static_argnames": 2}, "a str or strs"),
    ({"static_argnums": True}, "an int or ints"),
    ({"static_argnums": 0, "donate_argnames": "w"}, "both static and donated"),
])
def test_bad_static_or_donated_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CallSpec.of(_step, dict(kwargs))


def test_static_arguments_and_non_array_leaves_go_into_the_key():
    spec = CallSpec.of(_step, {"static_argnames": "act"})
    w, x = np.ones(3, np.float32), np.ones(3, np.float32)
    one = CallSplit.of((w, x, "tanh"), {"scale": 2.0}, spec)
    assert len(one.dynamic) == 3         # w, x and the Python number
    args, kwargs = one.rebuild(one.dynamic)
    assert args[2] == "tanh" and kwargs == {"scale": 2.0}
    same = CallSplit.of((2 * w, x, "tanh"), {"scale": 3.0}, spec)
    assert same.key == one.key           # other values, one program
    other = CallSplit.of((w, x, "relu"), {"scale": 2.0}, spec)
    shape = CallSplit.of((np.ones(4, np.float32), x, "tanh"), {"scale": 2.0}, spec)
    assert other.key != one.key and shape.key != one.key


def test_donated_inputs_are_named_by_their_place_among_the_dynamic_ones():
    spec = CallSpec.of(_step, {"donate_argnums": 1})
    split = CallSplit.of(({"a": np.ones(2), "b": np.ones(2)}, np.ones(2)), {}, spec)
    assert split.donated == (2,)


def test_an_unhashable_static_value_is_refused():
    spec = CallSpec.of(_step, {"static_argnums": 2})
    with pytest.raises(ValueError, match="not hashable"):
        CallSplit.of((np.ones(2), np.ones(2), ["tanh"]), {}, spec)


def test_a_traced_argument_is_refused_with_the_order_to_use():
    def call(x):
        return CallSplit.of((x,), {}, CallSpec())
    with pytest.raises(TypeError, match="outermost transformation"):
        jax.grad(lambda x: call(x) and 0.0)(1.0)


def test_in_shardings_need_one_entry_per_non_static_positional_argument():
    devices = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    spec = CallSpec.of(_step, {"in_shardings": (devices,)})
    with pytest.raises(ValueError, match="one .* per argument"):
        CallSplit.of((np.ones(2), np.ones(2)), {}, spec)


def test_results_keep_their_non_array_leaves_aside():
    out, traced = OutputTree.of({"y": jnp.ones(2), "name": "layer", "n": 3})
    assert len(traced) == 2              # the array and the number, as jax.jit
    restored = out.restore(out.placeholder(traced))
    assert restored["name"] == "layer" and restored["n"] == 3


def test_what_counts_as_dynamic():
    assert is_dynamic(np.ones(2)) and is_dynamic(1.5)
    assert is_dynamic(jax.ShapeDtypeStruct((2,), jnp.float32))
    assert not is_dynamic(1.5, in_module=True)
    assert not is_dynamic("tanh") and not is_dynamic(None)

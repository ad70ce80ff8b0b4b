"""The version shims of ``remat._jax.compat``."""

import dataclasses
import pathlib
import types

import jax.numpy as jnp
import pytest

from remat._jax import compat
from remat._jax.compat import AbstractRef, core


@dataclasses.dataclass(frozen=True)
class _Context:     # the shape of jax 0.11's DischargeContext
    in_avals: list
    out_avals: list
    should_discharge: list
    strip_memory_space: bool = False


def _registered_through_a_context(monkeypatch):
    """Registers a recording rule with a stand-in for jax 0.11's discharge module;
    returns the rule as jax would call it, and the calls the rule received."""
    table, calls = {}, []
    fake = types.SimpleNamespace(
        DischargeContext=_Context,
        register_discharge_rule=lambda prim: lambda f: table.setdefault(prim, f))
    monkeypatch.setattr(compat, "state_discharge", fake)
    prim = core.Primitive("fake_region")
    compat.register_discharge_rule(
        prim, lambda in_avals, out_avals, *args, **params:
        calls.append((in_avals, out_avals, args, params)) or ([None], [args[0]]))
    return table[prim], calls


def test_a_context_is_unpacked_into_the_avals(monkeypatch):
    rule, calls = _registered_through_a_context(monkeypatch)
    ref = AbstractRef(core.ShapedArray((), jnp.float32))
    value = core.ShapedArray((2,), jnp.float32)
    new_vals, outs = rule(_Context([ref, value], [value], [True, False]), 1.0, 2.0, k=3)
    assert calls == [([ref, value], [value], (1.0, 2.0), {"k": 3})]
    assert (new_vals, outs) == ([None], [1.0])


def test_a_partial_discharge_is_refused(monkeypatch):
    rule, calls = _registered_through_a_context(monkeypatch)
    ref = AbstractRef(core.ShapedArray((), jnp.float32))
    with pytest.raises(NotImplementedError, match="only some of a region's refs"):
        rule(_Context([ref, ref], [], [True, False]), 1.0, 2.0)
    assert not calls


def test_a_release_outside_the_tested_range_is_named_with_the_fix():
    assert compat.untested_release_warning("0.10.2") is None
    assert compat.untested_release_warning("0.10.9") is None
    newer = compat.untested_release_warning("0.11.2")
    assert "jax 0.11.2" in newer and "lax.scan" in newer and "'jax>=0.10.2,<0.11'" in newer
    older = compat.untested_release_warning("0.9.2")
    assert "jax 0.9.2" in older and "lax.scan" not in older


def test_the_tested_range_is_the_one_pyproject_pins():
    pyproject = (pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text()
    low, high = (".".join(map(str, r)) for r in compat.TESTED_RANGE)
    assert f'"jax>={low},<{high}"' in pyproject
    assert f'"jaxlib>={low},<{high}"' in pyproject

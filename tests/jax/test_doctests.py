"""The examples in the JAX adapter's and the public functions' docstrings run."""

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", [
    "remat._jax.to_graph", "remat._analyze", "remat._jax.checkpoint",
    "remat._jax.residuals", "remat._jax.lowering", "remat._jax.refs",
    "remat._jax.inline", "remat._jax.auto", "remat._jax.scan_passes",
    "remat._jax.xla_figures", "remat._jax.pins", "remat._jax.call",
    "remat._jax.portfolio"])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0

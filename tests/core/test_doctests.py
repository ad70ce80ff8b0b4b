"""The examples in the core's docstrings run and print what they say."""

import doctest
import importlib

import pytest

MODULES = [
    "remat.core.graph", "remat.core.fusion", "remat.core.simulate", "remat.core.memlog",
    "remat.core.dot", "remat.core.schedulers.postorder", "remat.core.schedulers.dfs",
    "remat.core.schedulers.list", "remat.core.schedulers.best", "remat.core.plan",
    "remat.core.options", "remat.core.gc_pause", "remat._flags",
    "remat.core.algorithms.consolidate", "remat.core.bounds",
    "remat.core.algorithms.cost", "remat.core.columns", "remat.core.search", "remat.core.scheduled",
    "remat.core.evaluate", "remat.core.algorithms", "remat.core.algorithms.optimal",
    "remat.core.algorithms.optimal_candidates", "remat.core.column_plans", "remat.core.steps",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0

"""portfolio.py: the columns of a program in the order the search walks them."""

from remat._jax.portfolio import LAST_RESORT, WhileGatedReadsLower, algorithms, laid_out
from remat.core.columns import Candidate, Column, Point
from remat.core.options import resolve_options


def _column(name, order):
    return Column(f"{name}/order {order}", (1, 2), 1.0, int,
                  lambda target: Candidate((name, order, target), target, 0.0, ("plan", 0, None)),
                  rank=2 * order, plans_quickly=name not in LAST_RESORT)


def test_the_default_plans_optimal_only_on_small_programs():
    default = resolve_options({"memory_limit": 0.5}, {})
    assert "optimal" in algorithms(default, 100)
    assert "optimal" not in algorithms(default, 10_000)
    chosen = resolve_options({"memory_limit": 0.5, "algorithm": "optimal"}, {})
    assert algorithms(chosen, 10_000) == ("optimal",)


def test_the_first_orders_columns_come_first_and_optimal_on_other_orders_last():
    names = ("path", "standard", "optimal")
    columns = laid_out(_column, names, 3, None, dict)
    assert [c.name for c in columns] == [
        "path/order 0", "standard/order 0", "optimal/order 0",
        "path/order 1", "standard/order 1", "path/order 2", "standard/order 2",
        "optimal/order 1", "optimal/order 2"]
    assert not any(c.last_resort for c in columns)


def test_each_first_order_column_is_followed_by_its_twin_under_the_other_lowering():
    columns = laid_out(_column, ("path", "standard"), 2, "gate", dict)
    names = [c.name for c in columns]
    assert names[:4] == ["path/order 0", "path/order 0 (gate)",
                         "standard/order 0", "standard/order 0 (gate)"]
    twin = columns[1]
    assert twin.rank == 1 and twin.rungs == columns[0].rungs
    # the same plan, another key and lowering
    assert twin.plan(1).key == ("gate", ("path", 0, 1))
    assert twin.plan(1).payload[2] == "gate"
    later = [c for c in columns if c.last_resort]
    assert [c.name for c in later] == ["path/order 1 (gate)", "standard/order 1 (gate)"]
    assert columns[-2:] == later


def test_gated_plans_are_walked_after_an_answer_while_xla_reads_them_lower():
    points = {}
    follows = WhileGatedReadsLower(0, lambda: points)
    assert 0 in follows and 2 not in follows       # nothing compiled gated: a probe
    plan = (("region",),)
    points[plan] = Point(plan, 100, 5.0, "path/order 0")
    points["gate", plan] = Point(("gate", plan), 90, 5.0, "path/order 0 (gate)")
    assert 0 in follows                             # read lower gated
    points["gate", plan] = Point(("gate", plan), 110, 5.0, "path/order 0 (gate)")
    assert 0 not in follows                         # read higher: no more walks

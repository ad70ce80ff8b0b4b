import pytest

from remat.core.graph import GraphBuilder
from remat.core.schedulers import SCHEDULERS, get_scheduler
from remat.core.simulate import simulate

from .random_graphs import random_dag


@pytest.mark.parametrize("seed", range(60))
def test_best_is_never_worse_than_any_scheduler(seed):
    g = random_dag(seed, num_ops=40)
    peaks = {name: simulate(g, fn(g)).peak_bytes for name, fn in SCHEDULERS.items()}
    assert peaks["best"] == min(peaks["list"], peaks["dfs"], peaks["postorder"])


def test_schedulers_give_genuinely_different_orders_on_dags():
    distinct_pairs = {("list", "dfs"): 0, ("list", "postorder"): 0, ("dfs", "postorder"): 0}
    for seed in range(50):
        g = random_dag(seed, num_ops=40, fusion=False)
        orders = {name: SCHEDULERS[name](g) for name in ("list", "dfs", "postorder")}
        for a, b in distinct_pairs:
            distinct_pairs[a, b] += orders[a] != orders[b]
    assert all(count >= 25 for count in distinct_pairs.values()), distinct_pairs


def test_list_scheduler_frees_big_values_first():
    # Two independent branches from x: a big temporary that a reduction shrinks,
    # and a chain of small values. Running the shrinking op right after the big one
    # beats interleaving.
    b = GraphBuilder()
    x = b.add_input(8)
    (big,) = b.add_op("big", [x], [10_000])
    (small,) = b.add_op("small", [x], [8])
    (shrunk,) = b.add_op("shrink", [big], [8])
    (out,) = b.add_op("add", [small, shrunk], [8])
    g = b.build(outputs=[out])
    order = SCHEDULERS["list"](g)
    assert order.index(2) == order.index(0) + 1


def test_dfs_visits_the_heaviest_operand_first():
    b = GraphBuilder()
    x = b.add_input(4)
    (light,) = b.add_op("light", [x], [4])
    (heavy,) = b.add_op("heavy", [x], [4000])
    (out,) = b.add_op("join", [light, heavy], [4])
    g = b.build(outputs=[out])
    assert SCHEDULERS["dfs"](g) == (1, 0, 2)
    assert SCHEDULERS["postorder"](g) == (0, 1, 2)


def test_unknown_scheduler_names_the_choices():
    with pytest.raises(ValueError, match="postorder"):
        get_scheduler("fastest")


def test_ops_no_output_depends_on_are_scheduled():
    b = GraphBuilder()
    x = b.add_input(4)
    b.add_op("dead", [x], [4])
    (y,) = b.add_op("live", [x], [4])
    g = b.build(outputs=[y])
    for fn in SCHEDULERS.values():
        assert sorted(fn(g)) == [0, 1]

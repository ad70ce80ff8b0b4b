"""The planner's floor (remat.core.bounds): no algorithm goes below it."""

import pytest

from remat.core.algorithms import get_algorithm
from remat.core.bounds import planner_floor
from remat.core.graph import FUSION_KINDS
from remat.core.options import RematOptions
from remat.core.scheduled import on_schedule
from remat.core.simulate import simulate

from .random_graphs import random_dag, training_chain


def test_floor_rises_with_the_small_node_limit():
    g = training_chain(12)
    tl = simulate(g, tuple(range(g.num_ops)))
    floors = [planner_floor(g, tl, small) for small in (0, 100, 1001)]
    assert floors[0] == floors[1] < floors[2] == tl.peak_bytes


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("name", ["path", "standard"])
def test_no_plan_goes_below_the_floor(seed, name):
    g = random_dag(seed, num_ops=40, kinds=FUSION_KINDS)
    order = tuple(range(g.num_ops))
    tl = simulate(g, order)
    for small in (0, 500):
        floor = planner_floor(g, tl, small)
        assert floor <= tl.peak_bytes
        result = get_algorithm(name)(on_schedule(g, order),
                                     RematOptions(0, name, small_node_bytes=small))
        assert result.timeline.peak_bytes >= floor


def test_compress_floor_counts_only_expansions():
    from remat.core.algorithms import may_recompute
    g = training_chain(8)      # dots only: nothing compress may rebuild
    tl = simulate(g, tuple(range(g.num_ops)))
    assert planner_floor(g, tl, 0, may_recompute("compress")) == tl.peak_bytes
    assert planner_floor(g, tl, 0, may_recompute("path")) < tl.peak_bytes


def test_a_donated_input_added_after_an_op_counts_as_freeable():
    from remat.core.graph import GraphBuilder
    b = GraphBuilder()
    x = b.add_input(100)
    (a,) = b.add_op("f", [x], [100])
    y = b.add_input(1000, donated=True)     # value id 2, second input
    (z,) = b.add_op("g", [a, y], [10])
    g = b.build(outputs=[z])
    tl = simulate(g, (0, 1))
    assert planner_floor(g, tl, 0) <= tl.peak_bytes

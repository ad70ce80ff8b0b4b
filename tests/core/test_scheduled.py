"""on_schedule and Scheduled: per-order state lives there, never on the graph."""

import pytest

from remat.core.algorithms import get_algorithm
from remat.core.options import RematOptions
from remat.core.scheduled import on_schedule
from remat.core.schedulers import dfs_schedule
from remat.core.simulate import ScheduleError, anchor_steps, simulate

from .random_graphs import chain, random_dag, training_chain


def test_it_holds_the_order_positions_anchors_and_simulation():
    g = random_dag(5, num_ops=40, kinds=("loop", "loop", "reduce", "none"))
    order = dfs_schedule(g)
    s = on_schedule(g, list(order))
    assert s.graph is g and s.schedule == order
    assert all(order[s.position[o]] == o for o in range(g.num_ops))
    assert list(s.anchor) == anchor_steps(g, order)
    assert s.anchor != s.position            # some ops run in a later fusion
    assert s.timeline == simulate(g, order)
    assert not any(vars(s.caches).values())     # nothing worked out yet


def test_the_order_is_checked_unless_told_not_to():
    g = training_chain(4)
    backwards = tuple(reversed(range(g.num_ops)))
    with pytest.raises(ScheduleError, match="defined later"):
        on_schedule(g, backwards)
    with pytest.raises(ScheduleError, match="exactly once"):
        on_schedule(g, (0, 1))
    assert on_schedule(g, backwards, check=False).schedule == backwards


def test_a_simulation_given_is_used_if_it_is_of_this_order_and_model():
    g = training_chain(4)
    order = tuple(range(g.num_ops))
    tl = simulate(g, order)
    assert on_schedule(g, order, timeline=tl).timeline is tl
    other = simulate(g, dfs_schedule(g))
    if other.schedule != order:
        with pytest.raises(ValueError, match="another schedule"):
            on_schedule(g, order, timeline=other)
    c = chain(5, nbytes=100)
    reused = simulate(c, c.topological_order, reuse_result_buffers=True)
    assert any(reused.in_output_buffer)
    with pytest.raises(ValueError, match="reuse_result_buffers"):
        on_schedule(c, c.topological_order, timeline=reused)


def test_planning_leaves_the_graph_as_made():
    g = training_chain(8)
    attributes = dict(vars(g))
    scheduled = on_schedule(g, g.topological_order)
    for name in ("path", "standard", "compress", "optimal", "path"):
        get_algorithm(name)(scheduled, RematOptions(
            scheduled.timeline.peak_bytes * 3 // 4, name, small_node_bytes=0))
    assert vars(g).keys() == attributes.keys()
    assert all(vars(g)[k] is v for k, v in attributes.items())
    # what the algorithms learnt is on the Scheduled
    caches = scheduled.caches
    assert caches.trajectories and caches.peaks and caches.blocks
    assert caches.rebuild_peaks and caches.results


@pytest.mark.parametrize("seed", range(3))
def test_a_shared_scheduled_gives_the_plans_fresh_ones_give(seed):
    # every algorithm, at limits asked in any order, on one Scheduled: the plans
    # of a fresh Scheduled each time
    g = random_dag(seed, num_ops=50)
    shared = on_schedule(g, g.topological_order)
    peak = shared.timeline.peak_bytes
    for fraction in (0.7, 0.4, 0.85, 0.55):
        for name in ("standard", "path", "standardcompress"):
            options = RematOptions(int(peak * fraction), name, small_node_bytes=0)
            kept = get_algorithm(name)(shared, options)
            fresh = get_algorithm(name)(on_schedule(g, g.topological_order), options)
            assert kept.regions == fresh.regions
            assert kept.timeline.peak_bytes == fresh.timeline.peak_bytes
            assert kept.extra_flops == fresh.extra_flops

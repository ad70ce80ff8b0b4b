"""remat.core.column_plans: each (algorithm, order)'s plans, per model target."""

import dataclasses

import pytest

from remat.core import column_plans as module
from remat.core.column_plans import SMALLEST_SMALL_NODE, ColumnPlans
from remat.core.graph import Graph, GraphBuilder
from remat.core.options import RematOptions
from remat.core.scheduled import on_schedule
from remat.core.schedulers import get_scheduler

from .random_graphs import random_dag, residual_blocks


def _plans(graph, **options):
    order = get_scheduler("postorder")(graph)
    return ColumnPlans([on_schedule(graph, order)], RematOptions(0, **options))


def test_rungs_ascend_from_the_floor_to_below_the_plain_peak():
    plans = _plans(random_dag(3, num_ops=40))
    targets = plans.rungs("path", 0)
    assert list(targets) == sorted(set(targets))
    assert targets[0] == plans.floor(0, 0, "path")
    assert targets[-1] < plans.orders[0].timeline.peak_bytes


def test_each_target_is_planned_once_and_timed():
    plans = _plans(random_dag(4, num_ops=40))
    target = plans.rungs("standard", 0)[5]
    first = plans.of("standard", 0)(target)
    spent = plans.seconds
    assert spent > 0
    assert plans.of("standard", 0)(target) is first and plans.seconds == spent
    assert first.payload[0].rewritten is not None and first.payload[2] is None


def _forward_backward(length: int, nbytes: int) -> Graph:
    """A chain and its reverse, each step of the reverse reading its twin."""
    b = GraphBuilder()
    forward = [b.add_input(nbytes)]
    for i in range(length):
        forward += b.add_op(f"f{i}", [forward[-1]], [nbytes], flops=1)
    v = forward[-1]
    for i in reversed(range(length)):
        (v,) = b.add_op(f"b{i}", [v, forward[i]], [nbytes])
    return b.build(outputs=[v])


def test_the_default_small_node_limit_is_halved_until_a_target_is_within_reach():
    # values of 64 bytes: a small-node limit of 64 bytes or more keeps them all,
    # so a target below the plain peak needs one under 64 bytes: none
    graph = _forward_backward(30, 64)
    plans = _plans(graph, small_node_bytes=1 << 20)
    peak = plans.orders[0].timeline.peak_bytes
    assert plans.small_node_bytes(0, peak, "path") == 1 << 20
    low = plans.floor(0, 0, "path")
    assert low < peak and plans.small_node_bytes(0, low, "path") == 0
    given = _plans(graph, small_node_bytes=1 << 20,
                   small_node_given=True)
    assert given.small_node_bytes(0, low, "path") == 1 << 20
    assert SMALLEST_SMALL_NODE > 64


def test_optimal_solves_no_target_below_one_out_of_reach(monkeypatch):
    solves = []
    real = module.plan_optimal

    def counted(scheduled, options, start=None, least_peak_seconds=None):
        result = real(scheduled, options, start, least_peak_seconds)
        solves.append(options.model_target_bytes)
        # as if the solver proved every target infeasible
        return dataclasses.replace(result, status="infeasible",
                                   limit_bytes=result.timeline.peak_bytes - 1)

    monkeypatch.setattr(module, "plan_optimal", counted)
    plans = _plans(random_dag(5, num_ops=20), solver_seconds=2.0)
    plan = plans.of("optimal", 0)
    targets = plans.rungs("optimal", 0)
    high = plan(targets[10])
    assert solves == [targets[10]]
    assert plan(targets[4]) is high and solves == [targets[10]]   # below: no solve
    plan(targets[12])                                               # above: solved
    assert solves == [targets[10], targets[12]]


@pytest.mark.parametrize("seconds, algorithm, expected", [
    (60.0, "auto", (module.OPTIMAL_DEFAULT_SECONDS, module.LEAST_PEAK_DEFAULT_SECONDS)),
    (60.0, "optimal", (60.0, None))])
def test_optimal_in_the_default_solves_for_at_most_its_seconds(
        monkeypatch, seconds, algorithm, expected):
    limits = []
    real = module.plan_optimal

    def recorded(scheduled, options, start=None, least_peak_seconds=None):
        limits.append((options.solver_seconds, least_peak_seconds))
        return real(scheduled, options, start, least_peak_seconds)

    monkeypatch.setattr(module, "plan_optimal", recorded)
    plans = _plans(random_dag(6, num_ops=15), solver_seconds=seconds, algorithm=algorithm)
    plans.of("optimal", 0)(plans.rungs("optimal", 0)[-1])
    assert limits == [expected]


def test_segments_plans_realized_whole_add_the_followers_and_nothing_else():
    # each target's segments plan, its regions holding their followers: the
    # same recompute, other regions; a plan without followers is itself
    graph = residual_blocks()
    plans = ColumnPlans([on_schedule(graph, tuple(range(graph.num_ops)))],
                        RematOptions(0, "segments"))
    whole, segments = plans.whole(0), plans.of("segments", 0)
    changed = 0
    for target in plans.rungs("segments", 0):
        a, b = segments(target), whole(target)
        assert whole(target) is b and b.extra_flops == a.extra_flops
        if b is not a:
            changed += 1
            assert set(b.key) != set(a.key) and all(
                any(set(r.consumers) <= set(s.consumers) for s in b.key) for r in a.key)
    assert changed

"""``"optimal"``: the integer-programming yardstick, on synthetic graphs (no JAX)."""

import time
import types

import pytest

from remat.core.algorithms import ALGORITHMS, PlanResult, get_algorithm
from remat.core.algorithms import optimal_program
from remat.core.algorithms.optimal import plan_optimal
from remat.core.algorithms.optimal_candidates import candidates
from remat.core.graph import GraphBuilder
from remat.core.options import RematOptions
from remat.core.scheduled import on_schedule
from remat.core.simulate import check_schedule, simulate

from .random_graphs import random_dag, training_chain


def _limit(graph, fraction):
    base = simulate(graph, tuple(range(graph.num_ops)))
    fixed = base.input_bytes + base.output_bytes
    return fixed + int(fraction * (base.peak_bytes - fixed))


def _plan(name, graph, limit, **kw):
    order = tuple(range(graph.num_ops))
    return get_algorithm(name)(on_schedule(graph, order),
                               RematOptions(limit, name, small_node_bytes=0, **kw))


def test_registered():
    assert ALGORITHMS["optimal"] is get_algorithm("optimal")
    RematOptions(1, "optimal", solver_seconds=5)
    with pytest.raises(ValueError, match="solver_seconds"):
        RematOptions(1, "optimal", solver_seconds=0)


@pytest.mark.parametrize("layers,fraction", [(8, 0.75), (16, 0.75), (16, 0.5)])
def test_meets_reachable_limits_at_no_more_cost_than_heuristics(layers, fraction):
    g = training_chain(layers)
    limit = _limit(g, fraction)
    opt = _plan("optimal", g, limit)
    assert isinstance(opt, PlanResult) and opt.status
    assert opt.met and opt.status == "optimal" and opt.gap is not None
    check_schedule(opt.rewritten.graph, opt.rewritten.schedule)
    # the timeline is the one simulator's, of the rewritten program
    again = simulate(opt.rewritten.graph, opt.rewritten.schedule)
    assert again.peak_bytes == opt.timeline.peak_bytes <= limit
    for name in ("path", "standard"):
        heuristic = _plan(name, g, limit)
        if heuristic.met:
            assert opt.extra_flops <= heuristic.extra_flops, name


def test_loose_limit_needs_nothing():
    g = training_chain(6)
    r = _plan("optimal", g, _limit(g, 1.0))
    assert r.met and not r.regions and r.extra_flops == 0 and r.status == "optimal"


def test_unreachable_limit_is_reported():
    g = training_chain(6)
    r = _plan("optimal", g, 1)
    assert not r.met and r.status == "infeasible"
    # it still returns the least peak it can reach, realized and simulated
    assert r.timeline.peak_bytes < r.baseline.peak_bytes


def test_a_known_least_peak_plan_is_not_searched_again(monkeypatch):
    g = training_chain(6)
    first = _plan("optimal", g, 1)
    searches = []
    monkeypatch.setattr(optimal_program.Program, "least_peak",
                        lambda *args: searches.append(args))
    scheduled = on_schedule(g, tuple(range(g.num_ops)))
    again = plan_optimal(scheduled, RematOptions(2, "optimal", small_node_bytes=0),
                         least_peak=first)
    assert again.status == "infeasible" and again.limit_bytes == 2
    assert again.regions == first.regions and not searches


def test_the_least_peak_search_takes_at_most_its_seconds(monkeypatch):
    g = training_chain(6)
    given = []
    real = optimal_program.Program.least_peak
    monkeypatch.setattr(optimal_program.Program, "least_peak",
                        lambda self, seconds, verbose:
                        (given.append(seconds), real(self, seconds, verbose))[1])
    scheduled = on_schedule(g, tuple(range(g.num_ops)))
    options = RematOptions(1, "optimal", small_node_bytes=0, solver_seconds=30.0)
    capped = plan_optimal(scheduled, options, least_peak_seconds=0.5)
    assert given[0] <= 0.5 and capped.status == "infeasible"
    plan_optimal(scheduled, options)            # no cap: the time the solves left
    assert 0.5 < given[1] <= 30.0


def test_a_solve_out_of_time_leaves_no_least_peak_search(monkeypatch):
    # the solver found no selection before its deadline: the plan of least peak
    # is the heuristics' (no time is left to search for a lower one)
    g = training_chain(8)
    searches = []
    timed_out = types.SimpleNamespace(x=None, status=1, message="Time limit reached.",
                                      mip_gap=None, mip_dual_bound=None)
    monkeypatch.setattr(optimal_program.Program, "solve",
                        lambda self, target, seconds, *rest, **kw:
                        (time.sleep(max(seconds, 0) + 0.01), (timed_out, 0))[1])
    monkeypatch.setattr(optimal_program.Program, "least_peak",
                        lambda *args: searches.append(args))
    r = _plan("optimal", g, _limit(g, 0.3), solver_seconds=0.05)
    lowest = min((_plan(name, g, _limit(g, 0.3)) for name in ("path", "standard")),
                 key=lambda h: h.timeline.peak_bytes)
    assert r.status == "time_limit" and not r.met and not searches
    assert r.timeline.peak_bytes == lowest.timeline.peak_bytes < r.baseline.peak_bytes


def test_time_limit_reports_gap_or_no_plan():
    g = training_chain(24)
    r = _plan("optimal", g, _limit(g, 0.5), solver_seconds=0.01)
    assert r.status in ("time_limit", "optimal", "infeasible", "heuristic")
    if r.status == "time_limit" and r.gap is not None:
        assert r.gap >= 0.0
    if r.status == "heuristic":     # the solver had no time: the best plan known
        assert r.met and r.extra_flops == min(
            _plan(name, g, r.limit_bytes).extra_flops for name in ("path", "standard"))
    assert r.solve_seconds < 30


def test_candidates_respect_small_nodes():
    g = training_chain(6, act_bytes=1000)
    scheduled = on_schedule(g, tuple(range(g.num_ops)))
    assert not candidates(scheduled, RematOptions(0, "optimal", small_node_bytes=2000))
    assert candidates(scheduled, RematOptions(0, "optimal", small_node_bytes=0))


@pytest.mark.parametrize("seed", range(4))
def test_random_graphs_never_exceed_when_met(seed):
    g = random_dag(seed, num_ops=25)
    order = tuple(range(g.num_ops))
    base = simulate(g, order)
    r = get_algorithm("optimal")(on_schedule(g, order), RematOptions(
        int(base.peak_bytes * 0.8), "optimal", small_node_bytes=0, solver_seconds=5))
    check_schedule(r.rewritten.graph, r.rewritten.schedule)
    assert r.met == (r.timeline.peak_bytes <= r.limit_bytes)
    assert r.timeline.peak_bytes <= base.peak_bytes or r.status == "infeasible"


@pytest.mark.parametrize("layers", [12, 24])
def test_heuristics_are_near_the_optimum_at_half_the_temporaries(layers):
    # issue 6's yardstick: path and standard within 1.25x the optimum's recompute
    g = training_chain(layers)
    limit = _limit(g, 0.5)
    opt = _plan("optimal", g, limit)
    assert opt.met and opt.extra_flops > 0
    for name in ("path", "standard"):
        heuristic = _plan(name, g, limit)
        assert heuristic.met, name
        assert heuristic.extra_flops <= 1.25 * opt.extra_flops, name


def test_a_value_can_be_rebuilt_once_per_reader():
    # `a` is read early, then by r1 and r2, with a large pair (p, q) live between
    # them: one copy serving both readers holds `a` across that pair (peak 230);
    # a copy for each reader does not (220).
    b = GraphBuilder()
    x = b.add_input(10)
    a, = b.add_op("f", [x], [100], flops=5)
    y, = b.add_op("g", [a], [10])
    e, = b.add_op("big", [y], [100])
    e2, = b.add_op("shrink", [e], [10])
    r1, = b.add_op("h1", [a, e2], [10])
    p, = b.add_op("k", [r1], [100])
    q, = b.add_op("k2", [p], [100])
    q2, = b.add_op("shrink", [q], [10])
    r2, = b.add_op("h2", [a, q2], [10])
    g = b.build(outputs=[r2])
    for limit, regions in ((230, 1), (220, 2)):
        r = _plan("optimal", g, limit)
        assert r.met and r.status == "optimal" and r.timeline.peak_bytes <= limit
        assert len(r.regions) == regions
        assert all(region.recompute == (0,) for region in r.regions)
    assert {region.consumers for region in r.regions} == {(4,), (8,)}
    assert r.extra_flops == 10
    assert not _plan("optimal", g, 210).met

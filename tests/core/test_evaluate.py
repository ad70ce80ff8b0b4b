"""evaluate and known_peak: what a Scheduled remembers of the plans simulated."""

import pytest

from remat.core import evaluate as evaluate_module
from remat.core.evaluate import evaluate, known_peak
from remat.core.plan import PlanError, Region, apply_plan
from remat.core.scheduled import on_schedule
from remat.core.simulate import simulate

from .random_graphs import training_chain
from .test_plan import _unrealizable


def test_evaluate_is_apply_plan_then_simulate():
    graph = training_chain(6)
    order = tuple(range(graph.num_ops))
    regions = [Region((0, 1), (9, 10)), Region((2,), (7, 8))]
    rw, tl = evaluate(on_schedule(graph, order), regions)
    want = apply_plan(on_schedule(graph, order), regions)
    assert rw.schedule == want.schedule and rw.graph.ops == want.graph.ops
    assert tl == simulate(want.graph, want.schedule)


def test_evaluate_remembers_peaks_and_recent_results(monkeypatch):
    graph = training_chain(6)
    order = tuple(range(graph.num_ops))
    scheduled = on_schedule(graph, order)
    regions = [Region((0, 1), (9, 10)), Region((2,), (7, 8))]
    assert known_peak(scheduled, regions) is None
    rw, tl = evaluate(scheduled, regions)
    assert known_peak(scheduled, regions) == tl.peak_bytes
    # the same regions again: the same result, nothing applied or simulated again
    applied = []
    real = evaluate_module.apply_plan
    monkeypatch.setattr(evaluate_module, "apply_plan",
                        lambda *a: applied.append(1) or real(*a))
    again = evaluate(scheduled, list(regions))
    assert again[0] is rw and again[1] is tl
    assert not applied
    # a peak is remembered beyond the last few results; a plan that cannot be
    # realized is remembered as an infinite peak
    for k in range(1, 8):
        evaluate(scheduled, [Region((0,), (k + 5,))])
    assert known_peak(scheduled, regions) == tl.peak_bytes
    assert len(scheduled.caches.results) == evaluate_module._RESULTS_KEPT
    g, bad = _unrealizable()
    on_bad = on_schedule(g, (0, 1, 2))
    with pytest.raises(PlanError):
        evaluate(on_bad, bad)
    assert known_peak(on_bad, bad) == float("inf")
    # what one Scheduled knows is its own: the same order made again knows
    # nothing yet
    assert known_peak(on_schedule(graph, order), regions) is None


def test_evaluate_starts_again_once_it_holds_enough_peaks(monkeypatch):
    monkeypatch.setattr(evaluate_module, "_PEAKS_KEPT", 3)
    graph = training_chain(6)
    scheduled = on_schedule(graph, tuple(range(graph.num_ops)))
    trials = [[Region((0,), (k,))] for k in (7, 8, 9, 10)]
    peaks = [evaluate(scheduled, t)[1].peak_bytes for t in trials[:3]]
    assert [known_peak(scheduled, t) for t in trials[:3]] == peaks
    evaluate(scheduled, trials[3])
    assert known_peak(scheduled, trials[0]) is None      # forgotten
    assert known_peak(scheduled, trials[3]) is not None

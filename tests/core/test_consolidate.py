"""Merging regions that rebuild the same ops (remat.core.algorithms.consolidate)."""


from remat.core.algorithms import consolidate
from remat.core.algorithms.consolidate import _covers, merge_regions
from remat.core.evaluate import evaluate
from remat.core.plan import Region, apply_plan
from remat.core.scheduled import on_schedule
from remat.core.simulate import simulate

from .random_graphs import training_chain


def _in_order(graph):
    """``graph`` on the order its ops were built in."""
    return on_schedule(graph, tuple(range(graph.num_ops)))


def _peak_and_flops(graph, regions):
    rw = apply_plan(_in_order(graph), regions)
    return simulate(rw.graph, rw.schedule).peak_bytes, rw.extra_flops


def _segment_regions(layers):
    """Regions of a checkpointed chain as the greedy engine leaves them: the
    backward of layer ``i`` reads a copy of activation ``i`` (op ``i - 1``) and
    ``i + 1``, each rebuilt from the checkpoint (activation 0, the input)."""
    backward = lambda i: (layers + 1 + 2 * (layers - i - 1), layers + 2 + 2 * (layers - i - 1))
    return [Region(tuple(range(i + 1)), backward(i)) for i in range(layers - 1)]


def test_merging_rebuilds_shared_ops_once_when_the_limit_allows():
    graph = training_chain(4)
    regions = _segment_regions(4)
    peak, flops = _peak_and_flops(graph, regions)
    merged = merge_regions(_in_order(graph), regions, 10**9)
    merged_peak, merged_flops = _peak_and_flops(graph, merged)
    assert len(merged) == 1 and merged[0].recompute == (0, 1, 2)
    assert merged_flops == 300 < flops == 600
    assert merged_peak > peak    # the copies are held longer: memory for compute


def test_merging_keeps_the_limit():
    graph = training_chain(6)
    regions = _segment_regions(6)
    peak, flops = _peak_and_flops(graph, regions)
    merged = merge_regions(_in_order(graph), regions, peak)
    merged_peak, merged_flops = _peak_and_flops(graph, merged)
    assert merged_peak <= peak and merged_flops <= flops
    # with one activation of room, some but not all merges fit
    roomier = merge_regions(_in_order(graph), regions, peak + 1000)
    roomier_peak, roomier_flops = _peak_and_flops(graph, roomier)
    assert roomier_peak <= peak + 1000
    assert 1 < len(roomier) < len(regions) and roomier_flops < flops


def test_disjoint_regions_are_left_alone():
    graph = training_chain(4)
    regions = [Region((0,), (7, 8)), Region((2,), (5, 6))]
    assert merge_regions(_in_order(graph), regions, 10**9) == regions


def test_a_merge_left_out_rules_out_merges_that_hold_it():
    # Regions as (recompute, consumers) sets: once {a} + {b} broke the limit,
    # merging a region holding a with one holding b is not tried; merging a
    # region holding only part of a side is.
    def sets(recompute, consumers):
        return frozenset(recompute), frozenset(consumers)
    a, b = sets({0, 1}, {9}), sets({0}, {7})
    rejected = {(a, b)}
    assert _covers(rejected, a, b) and _covers(rejected, b, a)
    assert _covers(rejected, sets({0, 1, 2}, {9, 10}), sets({0}, {7, 8}))
    assert not _covers(rejected, sets({0}, {9}), b)          # a's side not held
    assert not _covers(rejected, a, sets({0}, {8}))          # b's consumer missing
    assert not _covers(set(), a, b)


def _counted(monkeypatch, module, name: str) -> list:
    """Replaces ``module.name`` by a wrapper recording each call; the record."""
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: calls.append(1) or real(*a))
    return calls


def test_a_run_of_merges_that_all_fit_takes_one_simulation(monkeypatch):
    calls = _counted(monkeypatch, consolidate, "_fits")
    graph = training_chain(6)
    merged = merge_regions(_in_order(graph), _segment_regions(6),
                           10**9)
    assert len(merged) == 1 and len(calls) == 1


def test_the_simulation_of_the_merged_regions_comes_back_with_them():
    graph = training_chain(6)
    regions = _segment_regions(6)
    peak, _ = _peak_and_flops(graph, regions)
    merged, (rw, tl) = consolidate.merge_regions_simulated(
        _in_order(graph), regions, peak + 1000)
    assert rw.regions == tuple(merged)
    assert tl.peak_bytes == _peak_and_flops(graph, merged)[0] <= peak + 1000
    # no merge kept: nothing simulated
    assert consolidate.merge_regions_simulated(
        _in_order(graph), regions[:1], 10**9) == (regions[:1], None)


def _six_layers():
    """A 6-layer chain on its order, its segment regions and their simulated peak."""
    graph = training_chain(6)
    regions = _segment_regions(6)
    return _in_order(graph), regions, _peak_and_flops(graph, regions)[0]


def test_trials_known_to_miss_are_not_simulated_again(monkeypatch):
    from remat.core import evaluate as evaluate_module
    applied = _counted(monkeypatch, evaluate_module, "apply_plan")
    scheduled, regions, peak = _six_layers()
    first = merge_regions(scheduled, regions, peak + 1000)
    trials_first, applied[:] = len(applied), []
    scheduled.caches.merges.clear()     # not the answer: the trials again
    again = merge_regions(scheduled, regions, peak + 1000)
    assert again == first
    # the merges that missed are known: only those that fit are applied again
    assert len(applied) < trials_first


def test_the_same_question_is_answered_from_memory(monkeypatch):
    # Both starts of "standard" often hand over the same regions.
    calls = _counted(monkeypatch, consolidate, "_fits")
    scheduled, regions, peak = _six_layers()
    first = consolidate.merge_regions_simulated(scheduled, regions, peak + 1000)
    trials = len(calls)
    again = consolidate.merge_regions_simulated(scheduled, regions, peak + 1000)
    assert again == first and again[0] is not first[0] and len(calls) == trials > 0
    consolidate.merge_regions_simulated(scheduled, regions, peak + 2000)
    assert len(calls) > trials          # another limit: another question


def _sets(region):
    return frozenset(region.recompute), frozenset(region.consumers)


def test_merges_judged_to_break_the_limit_are_not_tried(monkeypatch):
    # With the simulation of the regions at hand, a merge whose held copies put
    # the stretch before the later block over the limit is skipped untried: the
    # same merges come out of fewer trials.
    calls = _counted(monkeypatch, consolidate, "_fits")
    answers = []
    for with_base in (False, True):
        scheduled, regions, peak = _six_layers()
        base = evaluate(scheduled, regions) if with_base else None
        answers.append((consolidate.merge_regions_simulated(
            scheduled, regions, peak + 1000, base=base)[0], len(calls)))
        calls[:] = []
    (untold, trials_untold), (told, trials_told) = answers
    assert told == untold and 0 < trials_told < trials_untold

"""Merging regions that rebuild the same ops (remat.core.algorithms.consolidate)."""

import pytest

from remat.core.algorithms import consolidate
from remat.core.algorithms.consolidate import _covers, merge_regions
from remat.core.graph import GraphBuilder
from remat.core.plan import Region, apply_plan, evaluate
from remat.core.simulate import simulate

from .random_graphs import training_chain


def _peak_and_flops(graph, regions):
    rw = apply_plan(graph, tuple(range(graph.num_ops)), regions)
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
    merged = merge_regions(graph, tuple(range(graph.num_ops)), regions, 10**9)
    merged_peak, merged_flops = _peak_and_flops(graph, merged)
    assert len(merged) == 1 and merged[0].recompute == (0, 1, 2)
    assert merged_flops == 300 < flops == 600
    assert merged_peak > peak    # the copies are held longer: memory for compute


def test_merging_keeps_the_limit():
    graph = training_chain(6)
    regions = _segment_regions(6)
    peak, flops = _peak_and_flops(graph, regions)
    merged = merge_regions(graph, tuple(range(graph.num_ops)), regions, peak)
    merged_peak, merged_flops = _peak_and_flops(graph, merged)
    assert merged_peak <= peak and merged_flops <= flops
    # with one activation of room, some but not all merges fit
    roomier = merge_regions(graph, tuple(range(graph.num_ops)), regions, peak + 1000)
    roomier_peak, roomier_flops = _peak_and_flops(graph, roomier)
    assert roomier_peak <= peak + 1000
    assert 1 < len(roomier) < len(regions) and roomier_flops < flops


def test_disjoint_regions_are_left_alone():
    graph = training_chain(4)
    regions = [Region((0,), (7, 8)), Region((2,), (5, 6))]
    assert merge_regions(graph, tuple(range(graph.num_ops)), regions, 10**9) == regions


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
    merged = merge_regions(graph, tuple(range(graph.num_ops)), _segment_regions(6),
                           10**9)
    assert len(merged) == 1 and len(calls) == 1


def test_the_simulation_of_the_merged_regions_comes_back_with_them():
    graph = training_chain(6)
    regions = _segment_regions(6)
    peak, _ = _peak_and_flops(graph, regions)
    merged, (rw, tl) = consolidate.merge_regions_simulated(
        graph, tuple(range(graph.num_ops)), regions, peak + 1000)
    assert rw.regions == tuple(merged)
    assert tl.peak_bytes == _peak_and_flops(graph, merged)[0] <= peak + 1000
    # no merge kept: nothing simulated
    assert consolidate.merge_regions_simulated(
        graph, tuple(range(graph.num_ops)), regions[:1], 10**9) == (regions[:1], None)


def _six_layers():
    """A 6-layer chain, its order, its segment regions and their simulated peak."""
    graph = training_chain(6)
    regions = _segment_regions(6)
    return graph, tuple(range(graph.num_ops)), regions, _peak_and_flops(graph, regions)[0]


def test_trials_known_to_miss_are_not_simulated_again(monkeypatch):
    from remat.core import plan as plan_module
    applied = _counted(monkeypatch, plan_module, "apply_plan")
    graph, order, regions, peak = _six_layers()
    first = merge_regions(graph, order, regions, peak + 1000)
    trials_first, applied[:] = len(applied), []
    graph.__dict__.pop("_merged")       # not the answer: the trials again
    again = merge_regions(graph, order, regions, peak + 1000)
    assert again == first
    # the merges that missed are known: only those that fit are applied again
    assert len(applied) < trials_first


def test_the_same_question_is_answered_from_memory(monkeypatch):
    # Both starts of "standard" often hand over the same regions.
    calls = _counted(monkeypatch, consolidate, "_fits")
    graph, order, regions, peak = _six_layers()
    first = consolidate.merge_regions_simulated(graph, order, regions, peak + 1000)
    trials = len(calls)
    again = consolidate.merge_regions_simulated(graph, order, regions, peak + 1000)
    assert again == first and again[0] is not first[0] and len(calls) == trials > 0
    consolidate.merge_regions_simulated(graph, order, regions, peak + 2000)
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
        graph, order, regions, peak = _six_layers()
        base = evaluate(graph, order, regions) if with_base else None
        answers.append((consolidate.merge_regions_simulated(
            graph, order, regions, peak + 1000, base=base)[0], len(calls)))
        calls[:] = []
    (untold, trials_untold), (told, trials_told) = answers
    assert told == untold and 0 < trials_told < trials_untold


def _judged_merges_are_over(limits, judged_over) -> int:
    """On the six-layer chain, every merge of two regions that
    ``judged_over(held, a, b)`` says breaks the limit does: the count of them."""
    graph, order, regions, peak = _six_layers()
    base = evaluate(graph, order, regions)
    judged = 0
    for limit in (peak + room for room in limits):
        for i, a in enumerate(regions):
            for b in regions[i + 1:]:
                if judged_over(lambda: consolidate._HeldCopies(graph, order, base, limit),
                               _sets(a), _sets(b)):
                    judged += 1
                    merged = [r for r in regions if r not in (a, b)]
                    merged.append(consolidate._merged(a, b))
                    assert _peak_and_flops(graph, merged)[0] > limit
    return judged


def test_a_merge_judged_over_the_limit_is_over_it():
    assert _judged_merges_are_over((0, 1000, 2000),
                                   lambda held, a, b: held().over(a, b)) > 0


def test_the_copies_of_the_blocks_a_merge_swallows_count():
    # Merging two regions makes one block of everything between their consumers:
    # the blocks between join it, and their copies are made at its start. Merges
    # judged over only for those copies (their count zeroed, judged within)
    # are over.
    def over_for_those_copies(held, a, b):
        blind = held()
        blind.copy_bytes = [0] * len(blind.copy_bytes)
        return held().over(a, b) and not blind.over(a, b)
    assert _judged_merges_are_over((1000, 2000, 3000), over_for_those_copies) > 0


def test_the_merges_of_a_run_add_up():
    # Once a run takes a merge, its held copies count against the next: a merge
    # that fits alone is judged over beside one taken before, and is over.
    graph, order, regions, peak = _six_layers()
    base = evaluate(graph, order, regions)
    limit = peak + 2000     # two activations of room
    pairs = [(a, b) for i, a in enumerate(regions) for b in regions[i + 1:]]

    def fresh():
        return consolidate._HeldCopies(graph, order, base, limit)

    judged = 0
    for x in pairs:
        for y in pairs:
            if set(x) & set(y) or fresh().over(*map(_sets, x)) or fresh().over(
                    *map(_sets, y)):
                continue
            held = fresh()
            assert not held.over(*map(_sets, x))       # taken: it counts from now on
            if held.over(*map(_sets, y)):
                judged += 1
                merged = [r for r in regions if r not in x + y]
                merged += [consolidate._merged(*x), consolidate._merged(*y)]
                assert _peak_and_flops(graph, merged)[0] > limit
    assert judged > 0


def _judged_at_the_merged_peak(graph, early: Region, late: Region) -> None:
    """Merging ``early`` and ``late`` is judged over a limit one byte under
    the merged plan's simulated peak, and within one at it."""
    order = tuple(range(graph.num_ops))
    base = evaluate(graph, order, [early, late])
    peak = evaluate(graph, order, [consolidate._merged(early, late)])[1].peak_bytes
    assert peak > base[1].peak_bytes
    for limit, over in ((peak - 1, True), (peak, False)):
        held = consolidate._HeldCopies(graph, order, base, limit)
        assert held.over(_sets(early), _sets(late)) is over


def test_what_the_late_block_reads_from_between_is_made_before_the_merged_block():
    # The late consumer reads ``m``, made between the two blocks by an op that
    # does not depend on the early one: the merged block waits for ``m``, which
    # is then live across its copies.
    b = GraphBuilder()
    x = b.add_input(10)
    (a,) = b.add_op("f", [x], [1000], flops=100)
    (y,) = b.add_op("h", [a], [10])
    (z,) = b.add_op("k", [y, a], [10])            # op 2: the early consumer
    (m,) = b.add_op("g", [x], [2000])
    (w,) = b.add_op("k", [z, a, m], [10])         # op 4: the late consumer
    _judged_at_the_merged_peak(b.build(outputs=[w]), Region((0,), (2,)),
                               Region((0,), (4,)))


@pytest.mark.parametrize("early", [(0, 1, 3, 4), (0, 1, 2, 3, 4)])
def test_a_fused_copy_holds_what_it_reads_until_the_late_consumer(early):
    # The late region rebuilds the mask ``gt(c)`` (op 2), fused into the late
    # consumer: merged, it runs there, at the block's end, so the copy of ``c``
    # it reads is held across the early region's other copies (whether the
    # early region made an unread copy of the mask or none).
    b = GraphBuilder()
    x = b.add_input(10)
    (c,) = b.add_op("conv", [x], [1000], flops=100)
    (r,) = b.add_op("relu", [c], [1000], flops=10)
    (mask,) = b.add_op("gt", [c], [250], flops=10, fusion="loop")
    (d,) = b.add_op("conv", [r], [1000], flops=100)
    (e,) = b.add_op("relu", [d], [1000], flops=10)
    (ga,) = b.add_op("bwd", [e], [10])                          # op 5: early
    (w,) = b.add_op("bwd", [ga, r, mask], [10], fusion="loop")  # op 6: late
    _judged_at_the_merged_peak(b.build(outputs=[w]), Region(early, (5,)),
                               Region((0, 1, 2), (6,)))

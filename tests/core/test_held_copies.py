"""Merges judged over the limit without a trial (remat.core.algorithms.held_copies):
every merge judged over is over, by the simulator."""

import pytest

from remat.core.algorithms.consolidate import _merged
from remat.core.algorithms.held_copies import HeldCopies
from remat.core.evaluate import evaluate
from remat.core.graph import GraphBuilder
from remat.core.plan import Region

from .test_consolidate import _in_order, _peak_and_flops, _sets, _six_layers


def _judged_merges_are_over(limits, judged_over) -> int:
    """On the six-layer chain, every merge of two regions that
    ``judged_over(held, a, b)`` says breaks the limit does: the count of them."""
    scheduled, regions, peak = _six_layers()
    graph = scheduled.graph
    base = evaluate(scheduled, regions)
    judged = 0
    for limit in (peak + room for room in limits):
        for i, a in enumerate(regions):
            for b in regions[i + 1:]:
                if judged_over(lambda: HeldCopies(scheduled, base, limit),
                               _sets(a), _sets(b)):
                    judged += 1
                    merged = [r for r in regions if r not in (a, b)]
                    merged.append(_merged(a, b))
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
    scheduled, regions, peak = _six_layers()
    graph = scheduled.graph
    base = evaluate(scheduled, regions)
    limit = peak + 2000     # two activations of room
    pairs = [(a, b) for i, a in enumerate(regions) for b in regions[i + 1:]]

    def fresh():
        return HeldCopies(scheduled, base, limit)

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
                merged += [_merged(*x), _merged(*y)]
                assert _peak_and_flops(graph, merged)[0] > limit
    assert judged > 0


def _judged_at_the_merged_peak(graph, early: Region, late: Region) -> None:
    """Merging ``early`` and ``late`` is judged over a limit one byte under
    the merged plan's simulated peak, and within one at it."""
    scheduled = _in_order(graph)
    base = evaluate(scheduled, [early, late])
    peak = evaluate(scheduled, [_merged(early, late)])[1].peak_bytes
    assert peak > base[1].peak_bytes
    for limit, over in ((peak - 1, True), (peak, False)):
        held = HeldCopies(scheduled, base, limit)
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

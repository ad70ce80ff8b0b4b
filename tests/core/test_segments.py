"""``"segments"``: the plans a hand-written segmentation makes, found on the schedule."""

from remat.core.algorithms.result import PlanResult
from remat.core.algorithms.segments import _segmentations, plan_segments, with_followers
from remat.core.graph import GraphBuilder
from remat.core.options import RematOptions
from remat.core.scheduled import on_schedule
from remat.core.evaluate import evaluate
from remat.core.simulate import check_schedule

from .random_graphs import residual_blocks, training_chain


def _scheduled(graph):
    return on_schedule(graph, tuple(range(graph.num_ops)))


def _plan(graph, limit, **options):
    return plan_segments(_scheduled(graph), RematOptions(limit, "segments", **options))


def test_a_chain_keeps_every_kth_activation_and_rebuilds_the_others():
    g = training_chain(8)
    plans = _segmentations(_scheduled(g), 0)
    # keeping every 1st, 2nd, 3rd, 4th, 6th activation (of each kind of cut:
    # offset by one where the first activation, from the inputs alone, is a
    # block's input and no residual cut), or none; no plan twice
    assert len(plans) == len(set(map(tuple, plans))) > 6
    for regions in plans:
        rebuilt = set().union(*(r.recompute for r in regions))
        assert rebuilt <= set(range(9))          # the forward pass and the loss
        for r in regions:                        # a segment: consecutive layers
            assert r.recompute == tuple(range(r.recompute[0], r.recompute[-1] + 1))


def test_the_plan_for_a_limit_is_the_cheapest_within_it_else_the_lowest():
    g = training_chain(16)
    base = _scheduled(g).timeline.peak_bytes
    loose, tight = _plan(g, base - 1), _plan(g, 1)
    for r in (loose, tight):
        check_schedule(r.rewritten.graph, r.rewritten.schedule)
    assert loose.met and loose.timeline.peak_bytes < base
    assert not tight.met and tight.timeline.peak_bytes <= loose.timeline.peak_bytes
    assert loose.extra_flops <= tight.extra_flops or tight.timeline.peak_bytes < \
        loose.timeline.peak_bytes


def test_values_from_the_inputs_alone_do_not_break_a_cut():
    # a weight's cast c, read by the forward and the backward, depends on no
    # computed value: h1, before it, is still a cut (every later computed
    # residual depends on it), kept by the plan keeping every cut, which
    # rebuilds the cast
    b = GraphBuilder()
    x, w = b.add_input(100), b.add_input(10)
    (h0,) = b.add_op("relu", [x], [1000], flops=10)
    (h1,) = b.add_op("dot", [h0, w], [1000], flops=100)        # op 1
    (c,) = b.add_op("convert", [w], [1000])
    (h2,) = b.add_op("dot", [h1, c], [1000], flops=100)        # op 3
    (h3,) = b.add_op("dot", [h2, c], [1000], flops=100)
    (g3,) = b.add_op("dot", [h3, h2, c], [100], flops=100)
    (g2,) = b.add_op("dot", [g3, h1, c], [100], flops=100)
    (g1,) = b.add_op("dot", [g2, h0], [10], flops=100)
    g = b.build(outputs=[g1])
    every_cut = _segmentations(_scheduled(g), 0)[0]
    rebuilt = set().union(*(r.recompute for r in every_cut))
    assert 1 not in rebuilt and 2 in rebuilt


def test_a_small_node_limit_given_keeps_the_smaller_values():
    g = training_chain(8, act_bytes=1000)
    assert _plan(g, 1).regions              # the default limit is the greedy's
    assert not _plan(g, 1, small_node_bytes=2000, small_node_given=True).regions


def test_nothing_to_segment_is_the_program_as_written():
    b = GraphBuilder()
    x = b.add_input(10)
    (y,) = b.add_op("f", [x], [10])
    g = b.build(outputs=[y])
    r = _plan(g, 5)
    assert not r.regions and not r.met


def test_a_residual_connection_is_cut_at_the_blocks_ends_as_a_hand_segmentation_is():
    # two blocks h -> h + tanh(norm(h) @ w); the forward pass runs through h1
    # alone, which the backward does not read (the norm's and the add's
    # gradients need other operands): no residual cut splits the blocks, but
    # the plan keeping every cut keeps h1 and rebuilds each block from its input
    graph = residual_blocks()
    plans = _segmentations(_scheduled(graph), 0)
    blockwise = [p for p in plans if {(0, 1, 2), (4, 5, 6)} <= {r.recompute for r in p}]
    assert len(blockwise) == 1      # (with the loss, rebuilt from h2)
    scheduled = _scheduled(graph)
    rewritten, simulated = evaluate(scheduled, blockwise[0])
    check_schedule(rewritten.graph, rewritten.schedule)
    # realized as checkpoints are, each block's region holds the block's whole
    # backward pass: its consumers (tanh_grad, the weight's dot, norm_grad) and
    # their followers (the cotangent's dot and the sum passed on); the second
    # block's shares tanh_grad with the loss's (one block once realized)
    plan = PlanResult(tuple(rewritten.regions), rewritten, simulated, scheduled.timeline, 0)
    whole = with_followers(scheduled, plan)
    first = [r.consumers for r in whole.regions if r.recompute == (0, 1, 2)]
    later = {u for r in whole.regions if r.recompute != (0, 1, 2) for u in r.consumers}
    assert first == [tuple(range(14, 19))] and later == set(range(9, 14))
    assert whole.extra_flops == plan.extra_flops
    check_schedule(whole.rewritten.graph, whole.rewritten.schedule)
    assert with_followers(scheduled, whole) is whole      # nothing more to take

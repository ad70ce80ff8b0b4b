"""``"segments"``: the plans a hand-written segmentation makes, found on the schedule."""

from remat.core.algorithms.segments import _segmentations, plan_segments
from remat.core.graph import GraphBuilder
from remat.core.options import RematOptions
from remat.core.scheduled import on_schedule
from remat.core.evaluate import evaluate
from remat.core.simulate import check_schedule

from .random_graphs import training_chain


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
    b = GraphBuilder()
    x, w1, w2 = b.add_input(1000), b.add_input(10), b.add_input(10)

    def block(h, w):
        (n,) = b.add_op("norm", [h], [1000], flops=10)
        (a,) = b.add_op("dot", [n, w], [1000], flops=100)
        (t,) = b.add_op("tanh", [a], [1000], flops=10)
        (out,) = b.add_op("add", [h, t], [1000], flops=10)
        return n, t, out

    n1, t1, h1 = block(x, w1)                                       # ops 0-3
    n2, t2, h2 = block(h1, w2)                                      # ops 4-7
    (loss,) = b.add_op("reduce_sum", [h2], [4], flops=10)
    grads = []
    g = loss
    for n, t, w in ((n2, t2, w2), (n1, t1, w1)):
        (da,) = b.add_op("tanh_grad", [g, t], [3000], flops=10)    # (the peak)
        grads += b.add_op("dot", [da, n], [10], flops=100)
        (dn,) = b.add_op("dot", [da, w], [1000], flops=100)
        (dh,) = b.add_op("norm_grad", [dn, n], [1000], flops=10)
        (g,) = b.add_op("add", [dh, g], [1000], flops=10)
    graph = b.build(outputs=grads)
    plans = _segmentations(_scheduled(graph), 0)
    blockwise = [p for p in plans if {(0, 1, 2), (4, 5, 6)} <= {r.recompute for r in p}]
    assert len(blockwise) == 1      # (with the loss, rebuilt from h2)
    r = evaluate(_scheduled(graph), blockwise[0])[0]
    check_schedule(r.graph, r.schedule)

import time

import pytest

from remat.core.fusion import fused_values
from remat.core.graph import GraphBuilder
from remat.core.schedulers import SCHEDULERS
from remat.core.simulate import ScheduleError, donated_aliases, simulate

from .random_graphs import chain, random_dag


def test_chain_peak_is_input_output_and_two_temporaries():
    g = chain(5, nbytes=100)  # x, t0..t3 temporaries, t4 output
    assert simulate(g, g.topological_order).peak_bytes == 400  # x + out + 2 temporaries
    tl = simulate(g, g.topological_order, reuse_result_buffers=True)
    assert tl.input_bytes == 100 and tl.output_bytes == 100
    # one of the two temporaries sits in the unwritten output buffer
    assert tl.peak_bytes == 300
    assert tl.in_output_buffer[1] and not tl.in_output_buffer[2]
    assert tl.live_after_bytes[-1] == 200


def test_temporaries_use_unwritten_result_buffers_one_at_a_time():
    b = GraphBuilder()
    x = b.add_input(10)
    (big,) = b.add_op("big", [x], [500])
    (small,) = b.add_op("small", [big], [100])
    (too_big,) = b.add_op("too_big", [small], [2000])
    (late,) = b.add_op("late", [too_big], [10])
    (grad,) = b.add_op("grad", [late, small], [600])
    g = b.build(outputs=[grad])
    assert not any(simulate(g, g.topological_order).in_output_buffer)
    tl = simulate(g, g.topological_order, reuse_result_buffers=True)
    assert tl.in_output_buffer[big]  # fits in grad's 600 bytes, dies at step 1
    assert not tl.in_output_buffer[too_big]  # larger than any result buffer
    assert not tl.in_output_buffer[small]  # read by grad itself: alive when written
    assert tl.peak_bytes == 10 + 600 + 100 + 2000 + 10  # while "late" runs


def test_rejects_non_topological_schedule():
    g = chain(3)
    with pytest.raises(ScheduleError, match="defined later"):
        simulate(g, (1, 0, 2))
    with pytest.raises(ScheduleError, match="exactly once"):
        simulate(g, (0, 1))


def test_fused_elementwise_chain_takes_no_memory_but_keeps_its_inputs_alive():
    b = GraphBuilder()
    x = b.add_input(1000)
    (d,) = b.add_op("dot", [x], [100])
    (a,) = b.add_op("mul", [d], [100], fusion="loop")
    (c,) = b.add_op("add", [a], [100], fusion="loop")
    (s,) = b.add_op("reduce", [c], [4], fusion="reduce")
    g = b.build(outputs=[s])
    assert fused_values(g) == (False, False, True, True, False)
    tl = simulate(g, g.topological_order)
    # d lives until the reduction (the fusion's anchor), a and c never take memory.
    assert tl.last_use_step[d] == 3
    assert tl.peak_bytes == 1000 + 4 + 100
    assert tl.defined_bytes == [100, 0, 0, 0]


def test_multi_use_elementwise_is_materialized_unless_cheap_to_duplicate():
    b = GraphBuilder()
    x = b.add_input(100)
    s = b.add_input(4)
    (e,) = b.add_op("exp", [x], [100], fusion="loop", transcendentals=25)
    (bcast,) = b.add_op("broadcast", [s], [100], fusion="loop")
    (u,) = b.add_op("u", [e, bcast], [4], fusion="reduce")
    (w,) = b.add_op("w", [e, bcast], [4], fusion="reduce")
    g = b.build(outputs=[u, w])
    fused = fused_values(g)
    assert not fused[e]  # read by two fusions: XLA:CPU does not duplicate it
    assert fused[bcast]  # a broadcast is duplicated into both


def test_a_copied_op_is_fused_into_several_fusions_whatever_its_bytes():
    # an op the compiled program showed computed inside each fusion reading it
    # takes no memory of its own; read by a dot, it is stored all the same
    b = GraphBuilder()
    x = b.add_input(100)
    (e,) = b.add_op("exp", [x], [100], fusion="loop", transcendentals=25)
    (u,) = b.add_op("u", [e], [4], fusion="reduce")
    (w,) = b.add_op("w", [e], [4], fusion="reduce")
    (f,) = b.add_op("exp", [x], [100], fusion="loop")
    (d,) = b.add_op("dot", [f], [4])
    g = b.build(outputs=[u, w, d])
    copied = g.with_copied([0, 3])
    assert [op.fusion for op in copied.ops] == [
        "copied", "reduce", "reduce", "copied", "none"]
    assert not fused_values(g)[e] and fused_values(copied)[e]
    assert not fused_values(copied)[f]
    order = (0, 1, 2, 3, 4)
    assert simulate(g, order).defined_bytes[0] == 100      # e, stored
    assert simulate(copied, order).defined_bytes[0] == 0
    assert g.with_copied([1, 2, 4]) is g     # only elementwise ops are copied


def test_multi_use_value_inside_one_fusion_is_fused():
    b = GraphBuilder()
    x = b.add_input(100)
    h = b.add_input(100)
    (q,) = b.add_op("q", [x], [100], fusion="loop")
    (r,) = b.add_op("mul", [q, h], [100], fusion="loop")
    (s,) = b.add_op("add", [q, r], [100], fusion="loop")
    (t,) = b.add_op("dot", [s], [100])
    g = b.build(outputs=[t])
    fused = fused_values(g)
    assert fused[q] and fused[r] and not fused[s]


def test_donated_input_is_freed_after_last_use():
    b = GraphBuilder()
    x = b.add_input(1000, donated=True)
    (y,) = b.add_op("a", [x], [10])
    (z,) = b.add_op("b", [y], [10])
    tl = simulate(b.build(outputs=[z]), (0, 1))
    assert tl.live_during_bytes == [1000 + 10 + 10, 10 + 10]


def test_a_result_written_into_a_donated_input_shares_its_buffer():
    # As XLA aliases a donated argument with the result JAX pairs it with: one buffer.
    b = GraphBuilder()
    w = b.add_input(1000, shape="f32[250]", donated=True)
    x = b.add_input(10, shape="f32[2]")
    (h,) = b.add_op("dot", [x, w], [400])
    (u,) = b.add_op("sub", [w, h], [1000], output_shapes=["f32[250]"])
    g = b.build(outputs=[u])
    assert donated_aliases(g) == {w: u}
    tl = simulate(g, (0, 1))
    assert tl.live_during_bytes == [10 + 1000 + 400] * 2
    assert tl.live_after_bytes[-1] == 10 + 1000


def test_a_donated_input_read_after_its_result_is_written_takes_a_second_buffer():
    b = GraphBuilder()
    w = b.add_input(1000, shape="f32[250]", donated=True)
    x = b.add_input(10, shape="f32[2]")
    (u,) = b.add_op("sub", [w], [1000], output_shapes=["f32[250]"])
    (z,) = b.add_op("dot", [w, x], [10])
    tl = simulate(b.build(outputs=[u, z]), (0, 1))
    assert tl.live_during_bytes == [10 + 1000 + 10 + 1000] * 2     # w apart until read
    assert tl.live_after_bytes == [2020, 1020]


def test_donations_pair_as_jax_pairs_them():
    b = GraphBuilder()
    p = b.add_input(16, shape="f32[4]", donated=True)
    q = b.add_input(16, shape="f32[4]", donated=True)
    r = b.add_input(8, shape="f32[2]", donated=True)
    n = b.add_input(16, shape="f32[4]")              # not donated: not paired
    outs = [b.add_op("f", [v], [16], output_shapes=["f32[4]"])[0] for v in (q, p, n)]
    g = b.build(outputs=outs)
    assert donated_aliases(g) == {p: outs[0], q: outs[1]}    # in order; r: no result
    # a temporary may not live in a result buffer that still holds its donated input
    b = GraphBuilder()
    w = b.add_input(1000, shape="f32[250]", donated=True)
    (t,) = b.add_op("a", [w], [500])
    (s,) = b.add_op("b", [t], [10])
    (u,) = b.add_op("c", [w, s], [1000], output_shapes=["f32[250]"])
    tl = simulate(b.build(outputs=[u]), (0, 1, 2), reuse_result_buffers=True)
    assert not tl.in_output_buffer[t] and tl.peak_bytes == 1000 + 500 + 10


@pytest.mark.parametrize("seed", range(40))
def test_invariants_on_random_dags(seed):
    g = random_dag(seed, num_ops=50)
    fused = fused_values(g)
    for name, scheduler in SCHEDULERS.items():
        schedule = scheduler(g)
        simulate(g, schedule, reuse_result_buffers=True)  # consistent in both modes
        tl = simulate(g, schedule)  # checks it is a topological order of every op
        assert sorted(schedule) == list(range(len(g.ops))), name
        assert all(f >= 0 for f in tl.freed_bytes)
        assert all(b >= 0 for b in tl.live_after_bytes)
        # Everything defined and not an output nor a kept input is freed by the end.
        assert tl.live_after_bytes[-1] == tl.input_bytes - sum(
            g.values[v].nbytes for v in set(g.inputs)
            if v in g.donated and v not in g.outputs) + tl.output_bytes + sum(
            g.values[v].nbytes for v in set(g.inputs) & set(g.outputs) & g.donated)
        # The peak holds at least one op's materialized inputs and outputs.
        largest_op = max(
            sum(g.values[v].nbytes for v in set(op.inputs) | set(op.outputs) if not fused[v])
            for op in g.ops)
        assert tl.peak_bytes >= largest_op, name
        assert tl.peak_bytes >= tl.input_bytes - sum(
            g.values[v].nbytes for v in g.donated) + tl.output_bytes


def test_simulating_20000_ops_is_fast():
    g = random_dag(0, num_ops=20_000, num_inputs=10, window=50)
    start = time.perf_counter()
    for name in ("postorder", "dfs", "list"):
        simulate(g, SCHEDULERS[name](g))
    assert time.perf_counter() - start < 3.0  # typically ~0.5 s on 2 slow cores
    start = time.perf_counter()
    simulate(g, g.topological_order)
    assert time.perf_counter() - start < 0.5


def test_simulate_is_a_pure_function_of_graph_and_order():
    # nothing is kept between calls (on the graph or elsewhere): the same order
    # gives an equal, new timeline, and an order is checked whenever asked
    g = random_dag(3)
    order = tuple(g.topological_order)
    attributes = dict(vars(g))
    first = simulate(g, order)
    again = simulate(g, list(order))
    assert again == first and again is not first
    backwards = tuple(reversed(order))
    simulate(g, backwards, check=False)
    with pytest.raises(ScheduleError):
        simulate(g, backwards)
    assert vars(g).keys() == attributes.keys()
    assert all(vars(g)[k] is v for k, v in attributes.items())

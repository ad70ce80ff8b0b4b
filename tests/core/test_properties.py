"""Property tests over hypothesis-generated DAGs: every scheduler yields a
topological order of every op, the simulation's bookkeeping is consistent, and
"best" is the lowest of the three."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remat.core.fusion import fused_values
from remat.core.graph import FUSION_KINDS, Graph, GraphBuilder
from remat.core.schedulers import SCHEDULERS
from remat.core.simulate import simulate


@st.composite
def dags(draw) -> Graph:
    b = GraphBuilder()
    values = [b.add_input(draw(st.integers(0, 5000)), donated=draw(st.booleans()))
              for _ in range(draw(st.integers(1, 3)))]
    for i in range(draw(st.integers(1, 25))):
        operands = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
        sizes = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=2))
        values.extend(b.add_op(f"op{i}", operands, sizes,
                               fusion=draw(st.sampled_from(FUSION_KINDS)),
                               working_set_bytes=draw(st.sampled_from([0, 100]))))
    outputs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
    return b.build(outputs=outputs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_schedules_and_simulation_are_consistent(g):
    fused = fused_values(g)
    peaks = {}
    runs = [(name, reuse) for name in SCHEDULERS for reuse in (False, True)]
    for name, reuse in runs:
        schedule = SCHEDULERS[name](g)
        # raises unless a topological order of every op
        tl = simulate(g, schedule, reuse_result_buffers=reuse)
        if not reuse:
            peaks[name] = tl.peak_bytes
        assert min(tl.freed_bytes) >= 0 and min(tl.live_after_bytes) >= 0
        # live after a step = live during it - its scratch - what it frees
        for step, op_id in enumerate(schedule):
            assert (tl.live_after_bytes[step] == tl.live_during_bytes[step]
                    - g.ops[op_id].working_set_bytes - tl.freed_bytes[step])
        # total freed = everything allocated and not kept to the end
        kept = tl.input_bytes + tl.output_bytes
        allocated = sum(tl.defined_bytes)
        unread_donated = sum(g.values[v].nbytes for v in set(g.inputs)
                             if v in g.donated and not g.users[v])
        assert sum(tl.freed_bytes) + tl.live_after_bytes[-1] == kept - unread_donated + allocated
        largest_op = max(
            sum(g.values[v].nbytes for v in set(op.inputs) | set(op.outputs) if not fused[v])
            for op in g.ops)
        if not reuse:
            assert tl.peak_bytes >= largest_op
        else:
            assert tl.peak_bytes <= peaks[name]  # reuse never costs memory
    assert peaks["best"] == min(peaks["list"], peaks["dfs"], peaks["postorder"])

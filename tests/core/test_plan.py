"""apply_plan: copies, rewiring, contiguous convex blocks, cycles refused."""

import random

import pytest

from remat.core.algorithms.standard import plan_standard
from remat.core.fusion import fused_values
from remat.core.graph import Graph, GraphBuilder
from remat.core.options import RematOptions
from remat.core.plan import PlanError, Region, apply_plan, convex_hull
from remat.core.scheduled import on_schedule
from remat.core.schedulers import dfs_schedule
from remat.core.simulate import check_schedule, simulate

from .random_graphs import random_dag, training_chain


def test_copies_feed_the_consumers():
    g = training_chain(4)
    order = tuple(range(g.num_ops))
    # Recompute layer 1's activation (op 1) for its backward readers.
    late = tuple(u for u in g.users[g.ops[1].outputs[0]] if u > 4)
    rw = apply_plan(on_schedule(g, order), [Region(recompute=(1,), consumers=late)])
    check_schedule(rw.graph, rw.schedule)
    copies = [o for o, c in enumerate(rw.is_copy) if c]
    assert [rw.origin[o] for o in copies] == [1]
    (copy_out,) = rw.graph.ops[copies[0]].outputs
    readers = {rw.origin[u] for u in rw.graph.users[copy_out]}
    assert readers == set(late)
    (orig_out,) = rw.graph.ops[1].outputs     # originals keep their ids
    assert all(rw.origin[u] not in late for u in rw.graph.users[orig_out])


def test_blocks_are_contiguous_and_convex():
    g = training_chain(6)
    order = tuple(range(g.num_ops))
    consumers = (8, 12)           # two backward ops with others between them
    rw = apply_plan(on_schedule(g, order), [Region(recompute=(2,), consumers=consumers)])
    (block,) = rw.blocks
    first = rw.schedule.index(block[0])
    assert rw.schedule[first:first + len(block)] == tuple(block)
    hull = convex_hull(g, consumers)
    assert {rw.origin[o] for o in block if not rw.is_copy[o]} == hull
    assert all(rw.region[o] == 0 for o in block)


def test_overlapping_regions_are_merged():
    g = training_chain(6)
    order = tuple(range(g.num_ops))
    rw = apply_plan(on_schedule(g, order), [Region((1,), (8, 12)), Region((2,), (10, 14))])
    assert len(rw.blocks) == 1 and len(rw.regions) == 1
    assert set(rw.regions[0].recompute) == {1, 2}


def _unrealizable():
    """A graph and a region whose copy of op 1 reads ``a``, which op 0 defines
    inside the same block: the block would have to run before itself."""
    b = GraphBuilder()
    x = b.add_input(10)
    (a,) = b.add_op("a", [x], [10])
    (c,) = b.add_op("c", [a], [10])
    (d,) = b.add_op("d", [c, a], [10])
    return b.build(outputs=[d]), [Region(recompute=(1,), consumers=(0,))]


def test_cycle_is_refused():
    g, regions = _unrealizable()
    with pytest.raises(PlanError, match="its own region"):
        apply_plan(on_schedule(g, (0, 1, 2)), regions)


@pytest.mark.parametrize("seed", range(6))
def test_rewritten_graphs_pass_the_full_checks(seed):
    # apply_plan builds its graph unchecked (Graph.rewired patches the derived
    # fields of the original); rebuilding it checked gives the same graph, with
    # the same derived fields, and its topological order is one.
    if seed == 0:
        graph = training_chain(6)
        regions = [Region((0, 1), (9, 10)), Region((2,), (7, 8))]
        order = tuple(range(graph.num_ops))
    else:   # what a planner makes of a random program
        graph = random_dag(seed, num_ops=40)
        order = tuple(range(graph.num_ops))
        limit = int(simulate(graph, order).peak_bytes * 0.7)
        regions = plan_standard(on_schedule(graph, order), RematOptions(
            limit, "standard", small_node_bytes=0)).regions
        assert regions
    rw = apply_plan(on_schedule(graph, order), regions)
    g = rw.graph
    checked = Graph(g.values, g.ops, g.inputs, g.outputs, g.donated)
    for field in ("values", "ops", "inputs", "outputs", "donated", "users",
                  "predecessors", "successors"):
        assert getattr(checked, field) == getattr(g, field)
    check_schedule(g, g.topological_order)
    assert g.topological_order == rw.schedule
    assert fused_values(checked) == fused_values(g)


@pytest.mark.parametrize("first_seed", range(0, 60, 10))
def test_fusion_of_a_rewritten_graph_is_as_if_built_whole(first_seed):
    # fused_values of a rewritten graph starts from the original's and redoes
    # what the rewiring touched, and upstream where an op's fusion changed;
    # random regions on programs of mostly elementwise ops reading recent values
    # (long fused chains) give what the same graphs built whole give, and some
    # change the originals' flags
    realized = moved = 0
    for seed in range(first_seed, first_seed + 10):
        rng = random.Random(seed)
        graph = random_dag(seed, num_ops=30, num_inputs=2, max_operands=2, window=6,
                           kinds=("loop", "loop", "loop", "loop", "reduce", "none"))
        order = tuple(range(graph.num_ops))
        base = fused_values(graph)
        for _ in range(20):
            regions = []
            for _ in range(rng.randint(1, 3)):
                op = rng.randrange(graph.num_ops)
                readers = sorted({u for v in graph.ops[op].outputs
                                  for u in graph.users[v]})
                if not readers:
                    continue
                before = rng.sample(graph.predecessors[op],
                                    k=min(1, len(graph.predecessors[op])))
                consumers = rng.sample(readers, k=rng.randint(1, len(readers)))
                regions.append(Region(tuple(sorted({op, *before})),
                                      tuple(sorted(consumers))))
            try:
                g = apply_plan(on_schedule(graph, order), regions).graph
            except PlanError:
                continue
            realized += 1
            whole = Graph(g.values, g.ops, g.inputs, g.outputs, g.donated)
            assert fused_values(g) == fused_values(whole)
            moved += fused_values(g)[:len(base)] != base
    assert realized >= 100 and moved >= 5


def _priority_order(graph, rw, position):
    """The running order apply_plan promises, worked out plainly: units (a block,
    or an op outside blocks) in a topological order of the rewritten program,
    the earliest original position first (a block's: its first original op's;
    an op reading from blocks that frees at least the bytes it takes, not
    counting program outputs: the earliest of those blocks'). A block's
    original ops also wait for what they read in ``graph`` (the originals of
    the values the block recomputes for them)."""
    import heapq
    g = rw.graph
    unit = [("op", o) if k < 0 else ("block", k) for o, k in enumerate(rw.region)]
    key = {}
    for o, u in enumerate(unit):
        if not rw.is_copy[o]:
            key[u] = min(key.get(u, len(position)), position[o])
    outputs = set(graph.outputs)
    for o, u in enumerate(unit):
        if u[0] == "op" and not rw.is_copy[o]:
            op = graph.ops[o]
            sole = {v for v in op.inputs if graph.values[v].producer is not None
                    and v not in outputs and set(graph.users[v]) == {o}}
            taken = sum(graph.values[v].nbytes for v in op.outputs if v not in outputs)
            freed = sum(graph.values[v].nbytes for v in sole)
            read = [unit[p] for p in g.predecessors[o] if unit[p][0] == "block"]
            if read and freed and freed >= taken:
                key[u] = min([key[u]] + [key[b] for b in read])
    deps = {u: set() for u in key}
    for o, u in enumerate(unit):
        deps[u].update(unit[p] for p in g.predecessors[o] if unit[p] != u)
        if not rw.is_copy[o]:
            deps[u].update(unit[p] for p in graph.predecessors[o] if unit[p] != u)
    waiting = {u: [] for u in key}
    for u, d in deps.items():
        for p in d:
            waiting[p].append(u)
    left = {u: len(d) for u, d in deps.items()}
    ready = [(key[u], u) for u in key if not left[u]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, u = heapq.heappop(ready)
        order.extend(rw.blocks[u[1]] if u[0] == "block" else [u[1]])
        for w in waiting[u]:
            left[w] -= 1
            if not left[w]:
                heapq.heappush(ready, (key[w], w))
    return tuple(order)


@pytest.mark.parametrize("seed", range(1, 9))
def test_running_order_is_the_priority_order_of_blocks_and_ops(seed):
    # apply_plan orders the ops before the first block as scheduled and sorts
    # the rest; the same order as a plain priority sort over the whole program
    graph = random_dag(seed, num_ops=40)
    schedule = tuple(range(graph.num_ops)) if seed % 2 else dfs_schedule(graph)
    position = {o: s for s, o in enumerate(schedule)}
    checked = 0
    for fraction in (0.9, 0.7, 0.5):
        limit = int(simulate(graph, schedule).peak_bytes * fraction)
        regions = plan_standard(on_schedule(graph, schedule), RematOptions(
            limit, "standard", small_node_bytes=0)).regions
        if regions:
            rw = apply_plan(on_schedule(graph, schedule), regions)
            assert rw.schedule == _priority_order(graph, rw, position)
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("seed", range(1, 5))
def test_blocks_remembered_across_plans_rewrite_as_fresh_ones(seed):
    # apply_plan keeps each region's block on the Scheduled; plans sharing
    # regions (merge trials, in any order, on two schedules) rewrite exactly as
    # on a graph that remembers nothing
    graph = random_dag(seed, num_ops=40)
    order = tuple(range(graph.num_ops))
    limit = int(simulate(graph, order).peak_bytes * 0.7)
    regions = list(plan_standard(on_schedule(graph, order), RematOptions(
        limit, "standard", small_node_bytes=0)).regions)
    assert len(regions) >= 2
    schedules = [order, dfs_schedule(graph)]
    trials = [regions, regions[::-1], regions[1:], regions[:1] + regions[2:],
              [Region(tuple(sorted(set(regions[0].recompute) | set(regions[1].recompute))),
                      tuple(sorted(set(regions[0].consumers) | set(regions[1].consumers))))]
              + regions[2:],
              [Region(r.recompute, r.consumers[:1]) for r in regions]]
    for schedule in schedules:
        kept = on_schedule(graph, schedule)
        for trial in trials:
            fresh = on_schedule(graph, schedule)    # nothing kept
            try:
                want = apply_plan(fresh, trial)
            except PlanError:
                with pytest.raises(PlanError):
                    apply_plan(kept, trial)
                continue
            got = apply_plan(kept, trial)
            assert got.schedule == want.schedule and got.regions == want.regions
            assert got.graph.ops == want.graph.ops and got.blocks == want.blocks


def _fused_reader_graph(root: str):
    # a (big, from a dot) is read early by g and late by an elementwise mul whose
    # result fuses into `root` (elementwise "exp" or a "reduce_sum")
    b = GraphBuilder()
    x = b.add_input(10)
    (a,) = b.add_op("dot", [x], [100], flops=5)
    (y,) = b.add_op("g", [a], [10])
    (c,) = b.add_op("neg", [y], [100], fusion="loop")
    (m,) = b.add_op("mul", [a, c], [100], fusion="loop")
    if root == "exp":
        (e,) = b.add_op("exp", [m], [100], fusion="loop")
        (s,) = b.add_op("dot", [e], [10])
    else:
        (s,) = b.add_op("reduce_sum", [m], [10], fusion="reduce")
    return b.build(outputs=[s])


def test_a_block_takes_the_elementwise_fusion_of_its_consumers():
    g = _fused_reader_graph("exp")
    rw = apply_plan(on_schedule(g, tuple(range(g.num_ops))),
                    [Region(recompute=(0,), consumers=(3,))])
    # the exp the mul fuses into joins the block: the block hands out its result
    (block,) = rw.blocks
    assert [rw.origin[o] for o in block] == [0, 3, 4]
    assert rw.regions == (Region(recompute=(0,), consumers=(3, 4)),)
    # a reduction does not (XLA read ResNet-50's plans higher with them inside)
    g = _fused_reader_graph("reduce")
    rw = apply_plan(on_schedule(g, tuple(range(g.num_ops))),
                    [Region(recompute=(0,), consumers=(3,))])
    assert rw.regions == (Region(recompute=(0,), consumers=(3,)),)


def _dot_then(reader: str, out_bytes: int, *, also_read: bool = False):
    # a (from a dot) is read early by g and late by a dot d whose result only
    # `reader` reads (unless also_read: a second op reads it too)
    b = GraphBuilder()
    x = b.add_input(10)
    (a,) = b.add_op("dot", [x], [100], flops=5)
    (y,) = b.add_op("g", [a], [10])
    (d,) = b.add_op("dot", [a, y], [100], flops=5)
    (t,) = b.add_op(reader, [d], [out_bytes], fusion="loop")
    outputs = [t]
    if also_read:
        (z,) = b.add_op("h", [d], [10])
        outputs.append(z)
    return b.build(outputs=outputs)


@pytest.mark.parametrize("reader, out_bytes, also_read, joins", [
    ("transpose", 100, False, True),          # the only reader, no more bytes
    ("convert_element_type", 50, False, True),
    ("broadcast_in_dim", 400, False, False),  # it would hand out more bytes
    ("transpose", 100, True, False),          # the dot's result is handed out anyway
])
def test_a_block_takes_the_only_reader_of_a_consumers_result(reader, out_bytes,
                                                             also_read, joins):
    g = _dot_then(reader, out_bytes, also_read=also_read)
    rw = apply_plan(on_schedule(g, tuple(range(g.num_ops))),
                    [Region(recompute=(0,), consumers=(2,))])
    assert rw.regions == (Region(recompute=(0,), consumers=(2, 3) if joins else (2,)),)
    (block,) = rw.blocks
    assert [rw.origin[o] for o in block] == ([0, 2, 3] if joins else [0, 2])

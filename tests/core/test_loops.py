"""remat.core.loops: what a differentiated loop stacks, on synthetic bodies."""

import random

import pytest

from remat.core import loops
from remat.core.graph import GraphBuilder
from remat.core.loops import LoopBody, combine, loop_choices, pareto, rebuild


def _mlp_body():
    """``y = tanh(tanh(x @ w) @ w.T) + x``: carry x, slice w; JAX's residuals."""
    b = GraphBuilder()
    x, w = b.add_input(1000), b.add_input(400)
    (a,) = b.add_op("dot_general", [x, w], [1000], flops=10_000)
    (t,) = b.add_op("tanh", [a], [1000], flops=100)
    (s,) = b.add_op("sub", [t], [1000], flops=100)
    (wt,) = b.add_op("transpose", [w], [400], flops=0)
    (c,) = b.add_op("dot_general", [t, wt], [1000], flops=10_000)
    (u,) = b.add_op("tanh", [c], [1000], flops=100)
    (s2,) = b.add_op("sub", [u], [1000], flops=100)
    (y,) = b.add_op("add", [u, x], [1000], flops=100)
    residuals = (x, t, s, wt, u, s2)
    return LoopBody(b.build([y, *residuals]), 8, residuals, (x,))


def _random_body(seed, num_ops=14):
    rng = random.Random(seed)
    b = GraphBuilder()
    carry, free = b.add_input(rng.randint(1, 500)), b.add_input(rng.randint(1, 500))
    values = [carry, free]
    for i in range(num_ops):
        ins = rng.sample(values, k=min(len(values), rng.randint(1, 2)))
        values.extend(b.add_op(f"op{i}", ins, [rng.randint(1, 500)],
                               flops=rng.choice([0, 1, 10, 1000])))
    made = values[2:]
    residuals = tuple(rng.sample(made, k=min(len(made), rng.randint(2, 9)))) + (carry,)
    pinned = frozenset(rng.sample(range(num_ops), k=1)) if seed % 3 == 0 else frozenset()
    return LoopBody(b.build([values[-1], *residuals]), rng.randint(1, 20), residuals,
                    (carry,), pinned)


def test_frontier_runs_from_stack_everything_to_carry_only():
    body = _mlp_body()
    front = loop_choices(body)
    # The first choice costs nothing: it rebuilds only the free transpose.
    assert front[0].rebuilt == (5,) and front[0].flops == 0
    assert front[-1].kept == (0,) and front[-1].carries == ()   # x is a residual
    assert front[-1].stacked_bytes == 1000
    assert front[-1].flops == 10_000 * 2 + 100 * 4             # both dots, no add
    for a, b in zip(front, front[1:]):
        assert a.flops <= b.flops and a.memory(8) > b.memory(8)


def test_rebuild_reads_the_nearest_values_at_hand():
    body = _mlp_body()
    # sub(tanh) alone: from the kept tanh, one op.
    c = rebuild(body, {4})
    assert c.recompute == (2,) and c.flops == 100 and c.carries == ()
    # the transpose: from the weight slice, no carry needed.
    assert rebuild(body, {5}).recompute == (3,)


def test_a_carry_is_stacked_only_when_a_rebuild_needs_it():
    b = GraphBuilder()
    x, w = b.add_input(100), b.add_input(10)
    (a,) = b.add_op("mul", [x, w], [100], flops=100)
    (wt,) = b.add_op("neg", [w], [10], flops=10)
    body = LoopBody(b.build([a, a, wt]), 4, (a, wt), (x,))
    assert rebuild(body, {wt}).carries == ()
    c = rebuild(body, {a})
    assert c.carries == (x,) and c.stacked_bytes == 100 + 10


def test_pinned_ops_are_never_run_again():
    body = _mlp_body()
    pinned = LoopBody(body.graph, body.length, body.residuals, body.carries,
                      frozenset({1}))                   # the first tanh
    assert rebuild(pinned, {3}) is None                # tanh itself
    assert rebuild(pinned, {4}).recompute == (2,)       # sub, from the kept tanh
    assert all(1 not in c.recompute for c in loop_choices(pinned))


def test_carries_and_non_residuals_cannot_be_rebuilt():
    with pytest.raises(ValueError, match="carries"):
        rebuild(_mlp_body(), {0})
    with pytest.raises(ValueError, match=r"values \[1\] are not residuals"):
        rebuild(_mlp_body(), {1})


@pytest.mark.parametrize("seed", range(12))
def test_heuristic_frontier_close_to_every_subset(seed, monkeypatch):
    """Each end of the exhaustive frontier is on the heuristic one, and every
    heuristic choice is one of the exhaustive ones or dominated by one."""
    body = _random_body(seed)
    exact = loop_choices(body)
    monkeypatch.setattr(loops, "EXHAUSTIVE_RESIDUALS", 0)
    heuristic = loop_choices(body)
    n = body.length
    assert heuristic[0] == exact[0]
    assert heuristic[-1].memory(n) == exact[-1].memory(n)
    for h in heuristic:
        assert any(e.flops <= h.flops and e.memory(n) <= h.memory(n) for e in exact)


def test_pareto_drops_dominated_choices():
    body = _mlp_body()
    every = [rebuild(body, {r}) for r in body.rebuildable]
    front = pareto(body.length, every)
    for c in every:
        assert any(f.flops <= c.flops and f.memory(8) <= c.memory(8) for f in front)
    assert len({f.memory(8) for f in front}) == len(front)


def test_combine_moves_the_loop_freeing_most_per_flop():
    a = loop_choices(_mlp_body())
    chain = combine([a, a], [8, 2])
    assert chain[0] == (0, 0) and chain[-1] == (len(a) - 1, len(a) - 1)
    for before, after in zip(chain, chain[1:]):
        assert sum(after) == sum(before) + 1
    # The 8-iteration loop frees 4x the bytes per step: it moves first.
    assert chain[1] == (1, 0)
    with pytest.raises(ValueError, match="lengths"):
        combine([a], [1, 2])


def test_docstring_examples():
    import doctest
    result = doctest.testmod(loops, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_nested_choices_compose_memory_and_flops():
    inner_front = loop_choices(_mlp_body())                  # an 8-iteration loop
    deepest, lightest = inner_front[-1], inner_front[0]
    outer = loop_choices(_mlp_body())
    two = loops.NestedChoice(outer[1], (deepest, lightest), (8, 3), 0)
    assert two.stacked_bytes == outer[1].stacked_bytes
    assert two.working_bytes == outer[1].working_bytes + max(deepest.working_bytes,
                                                             lightest.working_bytes)
    assert two.flops == outer[1].flops + 8 * deepest.flops + 3 * lightest.flops
    assert two.memory(5) == 5 * two.stacked_bytes + two.working_bytes
    # Deeper: a nested choice inside a nested choice counts its whole recompute.
    three = loops.NestedChoice(outer[0], (two,), (4,), 1)
    assert three.flops == outer[0].flops + 4 * two.flops
    assert three.working_bytes == outer[0].working_bytes + two.working_bytes
    assert three.rebuilt == outer[0].rebuilt
    # The frontier over nested choices of several variants keeps the best of each.
    mixed = [loops.NestedChoice(c, (i,), (8,), k) for k, i in enumerate(inner_front)
             for c in outer]
    front = pareto(8, mixed)
    for c in mixed:
        assert any(f.flops <= c.flops and f.memory(8) <= c.memory(8) for f in front)


@pytest.mark.parametrize("count", range(1, 30))
@pytest.mark.parametrize("most", [2, 3, 6])
def test_spread_keeps_the_ends_and_at_most_most(count, most):
    picked = loops.spread(count, most)
    assert picked[0] == 0 and picked[-1] == count - 1
    assert len(picked) == min(count, most) and picked == sorted(set(picked))


def test_spread_refuses_fewer_than_two():
    with pytest.raises(ValueError, match="most must be at least 2, got 1"):
        loops.spread(5, 1)

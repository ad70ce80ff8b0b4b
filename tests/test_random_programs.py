"""The random programs of ``bench/random_programs.py`` and the automatic pass on a
few of them: the generator is deterministic and varied, hand segmentations keep the
values, and ``remat.plan`` meets what a hand segmentation reaches, monotonically.

The seeds here are small programs (a few MiB, a few blocks) so that each plan
takes seconds; ``python -m bench.bench_generalization`` runs the whole suite.
"""

import jax
import numpy as np
import pytest

import remat
from bench.bench_generalization import footprint, monotone_violations, plan_at
from bench.random_programs import FAMILIES, random_program

#: Small programs: dense float32 (5 blocks) and image float32 (4 blocks).
DENSE, IMAGE = 38, 3


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _plain(program) -> tuple[int, int]:
    """XLA's footprint and temporaries of the program's plain gradient."""
    return footprint(jax.jit(program.step).lower(program.params,
                                                 program.inputs).compile())


def _hand(program, segment: int) -> int:
    """XLA's footprint with each ``segment`` consecutive blocks checkpointed."""
    step = jax.jit(jax.value_and_grad(program.segmented_loss(segment)))
    return footprint(step.lower(program.params, program.inputs).compile())[0]


def test_deterministic_per_seed():
    for seed in (0, 7, DENSE):
        a, b = random_program(seed), random_program(seed)
        assert a.description == b.description and a.family == b.family
        for x, y in zip(_leaves((a.params, a.inputs)), _leaves((b.params, b.inputs))):
            np.testing.assert_array_equal(x, y)


def test_fifty_distinct_programs_of_every_family():
    programs = [random_program(seed) for seed in range(50)]
    assert len({p.description for p in programs}) == 50
    assert {p.family for p in programs} == set(FAMILIES)
    kinds = {b.kind for p in programs for b in p.blocks}
    assert kinds >= {"dense", "residual", "attention", "mlp", "conv",
                     "residual_conv", "pool", "head"}
    assert any("bf16" in p.description for p in programs)
    assert any("bf16" not in p.description for p in programs)
    for p in programs:
        assert len(p.blocks) == len(p.params) >= 2
        assert p.inputs[0].dtype == p.inputs[1].dtype == np.float32


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3"])
def test_bad_seed_is_refused(seed):
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        random_program(seed)


def test_bad_segment_is_refused():
    with pytest.raises(ValueError, match="segment must be >= 1"):
        random_program(0).segmented_loss(0)


@pytest.mark.parametrize("seed", [IMAGE, 14])     # 14: dense, most blocks in bf16
def test_hand_segmentation_keeps_the_gradients(seed):
    p = random_program(seed)
    want = jax.jit(p.step)(p.params, p.inputs)
    got = jax.jit(jax.value_and_grad(p.segmented_loss(2)))(p.params, p.inputs)
    for g, w in zip(_leaves(got), _leaves(want)):
        assert np.any(w != 0)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_remat_jit_gradients_equal_the_plain_ones():
    p = random_program(DENSE)
    limit = _hand(p, 2)     # a hand segmentation's footprint: met by the default
    step = remat.jit(p.step, memory_limit=limit)
    plan = step.plan_for(p.params, p.inputs)
    assert plan.met and plan.planned.total <= limit < plan.baseline.total
    assert plan.extra_flops > 0            # something is recomputed
    got, want = step(p.params, p.inputs), jax.jit(p.step)(p.params, p.inputs)
    for g, w in zip(_leaves(got), _leaves(want)):
        assert np.any(w != 0)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed,segment", [(DENSE, 1), (IMAGE, 1), (IMAGE, 2)])
def test_hand_segmentation_limit_met_by_default(seed, segment):
    p = random_program(seed)
    plain, _ = _plain(p)
    limit = _hand(p, segment)
    assert limit < plain
    a = plan_at(p, f"hand{segment}", limit)
    assert a.met, a.error
    assert a.planned <= limit


def test_hand_pair_limit_met_by_default_dense_chain():
    p = random_program(34)
    limit = _hand(p, 2)
    a = plan_at(p, "hand2", limit)
    assert a.met, a.error


def test_default_recomputes_about_what_optimal_does_where_small_values_are_cheap():
    # rp13's cheap drops are values under the default small-node limit (1 MiB); the
    # default plans without it too, and keeps the cheaper plan
    p = random_program(13)
    limit = min(_hand(p, 1), _hand(p, 2))
    default = plan_at(p, "default", limit)
    optimal = plan_at(p, "optimal", limit, algorithm="optimal")
    assert default.met and optimal.met, (default.error, optimal.error)
    assert default.extra_flops <= 1.25 * optimal.extra_flops


def test_monotone_sweep():
    p = random_program(IMAGE)
    plain, temp = _plain(p)
    attempts = [plan_at(p, f"{f:.1f}", int(plain - temp + f * temp))
                for f in (0.6, 0.75, 0.9)]
    assert any(a.met for a in attempts)
    assert monotone_violations(attempts) == []


def test_monotone_violations_are_found():
    from bench.bench_generalization import Attempt
    met = lambda label, limit, flops: Attempt(label, limit, True, limit, flops, 0.1, 1.0)
    refused = Attempt("b", 20, False, None, None, None, 1.0, "refused")
    assert monotone_violations([met("a", 10, 5.0), met("c", 30, 1.0)]) == []
    assert len(monotone_violations([met("a", 10, 5.0), refused])) == 1
    assert len(monotone_violations([met("a", 10, 5.0), met("c", 30, 6.0)])) == 1


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's two lowerings")
def test_attention_plans_fall_back_on_the_gate_where_a_branch_copies_the_heads():
    # rp90 (attention, 2 blocks): in a conditional's branch XLA copies each
    # attention head the region reads, laid out transposed outside, to the layout
    # its dots take, and reads path's plans over 0.8 down to its floor (only
    # segments met it, +73 MFLOP, about a quarter of the program's FLOPs).
    # Inlined and gated, the first plan path compiles meets it.
    p = random_program(90)
    plain, temp = _plain(p)
    plan = remat.plan(p.step, p.params, p.inputs, memory_limit=int(plain - 0.2 * temp))
    program_flops = plan.compiled.cost_analysis()["flops"]
    assert plan.met and "conditional(" not in plan.compiled.as_text()
    assert 0 < plan.extra_flops < 0.01 * program_flops

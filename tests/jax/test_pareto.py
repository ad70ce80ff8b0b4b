"""remat.pareto: one row per algorithm and limit, XLA's figures, a table, a plot."""

import jax
import jax.numpy as jnp

import remat


def _loss(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.mean(x ** 2)


def test_pareto_rows_table_and_plot(tmp_path):
    keys = jax.random.split(jax.random.key(0), 13)
    ws = [jax.random.normal(k, (128, 128)) / 12 for k in keys[:-1]]
    x = jax.random.normal(keys[-1], (1024, 128))
    # 1 byte: below what the arguments and outputs hold, refused before any search
    p = remat.pareto(jax.grad(_loss), ws, x, limits=(0.7, 1),
                     algorithms=("path", "optimal"), rounds=1, small_node_limit=0)
    assert [(r.algorithm, r.limit) for r in p.rows] == [
        ("none", None), ("path", 0.7), ("path", 1), ("optimal", 0.7), ("optimal", 1)]
    plain = p.rows[0]
    for r in p.rows:
        if r.algorithm != "none" and r.limit == 0.7:
            assert not r.error
            assert r.footprint_bytes <= r.limit_bytes < plain.footprint_bytes
            assert r.flops >= plain.flops and r.extra_flops >= 0
            assert r.step_seconds > 0
        if r.limit == 1:
            assert r.error and r.footprint_bytes is None
    table = p.to_markdown()
    assert table.count("\n") == 2 + len(p.rows) and "refused" in table
    assert str(p) == table and repr(p).count("ParetoRow(") == len(p.rows)
    assert "refused" in str(p.rows[-1]) and "MiB" in repr(p.rows[0])
    p.plot(tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").stat().st_size > 0


def test_optimal_from_remat_flags(monkeypatch):
    monkeypatch.setenv("REMAT_FLAGS", "--algorithm=optimal --solver_seconds=20")
    keys = jax.random.split(jax.random.key(1), 13)
    ws = [jax.random.normal(k, (128, 128)) / 12 for k in keys[:-1]]
    x = jax.random.normal(keys[-1], (1024, 128))
    step = remat.jit(jax.grad(_loss), memory_limit=0.7, small_node_limit=0)
    plan = step.plan_for(ws, x)
    assert plan.met and plan.result.status == "optimal" and plan.result.regions
    got = step(ws, x)
    want = jax.grad(_loss)(ws, x)
    for a, b in zip(got, want):
        assert jnp.allclose(a, b, rtol=1e-4, atol=1e-6)

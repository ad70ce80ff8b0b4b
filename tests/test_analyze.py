"""remat.analyze: predicted memory of whole programs."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import remat
from remat._jax.xla_figures import XlaFootprint


def _layers(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return x


def mlp_loss(ws, x):
    return jnp.mean(_layers(ws, x)**2)


def xla_footprint(fun, *args):
    """XLA's footprint less library scratch (XLA:GPU's cuBLAS workspace), which
    is none of the program's values."""
    fp = XlaFootprint.of(jax.jit(fun).lower(*args).compile())
    return fp.total - fp.scratch


def test_report_fields_and_dumps(tmp_path):
    ws = [jnp.ones((64, 64)) * 0.1 for _ in range(3)]
    x = jnp.ones((32, 64))
    report = remat.analyze(jax.value_and_grad(mlp_loss), ws, x)
    assert report.argument_bytes == 3 * 64 * 64 * 4 + 32 * 64 * 4
    assert report.output_bytes == 4 + 3 * 64 * 64 * 4
    assert report.peak_bytes == report.argument_bytes + report.output_bytes + report.temp_bytes
    assert report.temp_bytes > 0
    assert "tanh" in report.memlog() or "dot_general" in report.memlog()
    assert report.to_dot().startswith("digraph")
    assert "MemoryReport(peak" in str(report) and "test_analyze.py" in report.peak_op
    assert repr(report) == str(report) and len(repr(report)) < 300   # no schedule dump
    report.plot(tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000
    assert len(report.timeline.schedule) == len(report.graph.ops)


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="the memory model is XLA:CPU's (0.55x of XLA:GPU's peak "
                    "here, measured on an H100)")
def test_prediction_is_close_to_xla_on_a_small_mlp_gradient():
    ws = [jnp.ones((256, 256)) * 0.01 for _ in range(6)]
    x = jnp.ones((512, 256))
    step = jax.value_and_grad(mlp_loss)
    predicted = remat.analyze(step, ws, x).peak_bytes
    actual = xla_footprint(step, ws, x)
    assert 0.75 <= predicted / actual <= 1.25, (predicted, actual)


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="the memory model is XLA:CPU's")
def test_a_program_checkpointed_with_remat_is_predicted_as_its_lowering_runs_it():
    # Two segments of three layers under remat.checkpoint: the lowering keeps
    # XLA from merging each recomputation with the forward pass and from running
    # it before the cotangents exist, so the program holds less than the plain
    # one, and the prediction follows (it used to merge the recomputation away).
    ws = [jnp.ones((256, 256)) * 0.01 for _ in range(6)]
    x = jnp.ones((2048, 256))

    def segmented(ws, x):
        for k in (0, 3):
            x = remat.checkpoint(_layers)(ws[k:k + 3], x)
        return jnp.mean(x**2)

    step, plain = jax.value_and_grad(segmented), jax.value_and_grad(mlp_loss)
    predicted = remat.analyze(step, ws, x).peak_bytes
    actual = xla_footprint(step, ws, x)
    assert actual < 0.95 * xla_footprint(plain, ws, x)
    assert predicted < 0.95 * remat.analyze(plain, ws, x).peak_bytes
    assert 0.75 <= predicted / actual <= 1.25, (predicted, actual)


@pytest.mark.parametrize("scheduler", ["best", "list", "dfs", "postorder"])
def test_every_scheduler_is_available_and_best_is_lowest(scheduler):
    ws = [jnp.ones((16, 16)) for _ in range(4)]
    x = jnp.ones((8, 16))
    step = jax.value_and_grad(mlp_loss)
    peak = remat.analyze(step, ws, x, scheduler=scheduler).peak_bytes
    assert peak >= remat.analyze(step, ws, x, scheduler="best").peak_bytes


def test_keyword_arguments_reach_the_function():
    report = remat.analyze(lambda x, *, scale: x * scale, jnp.ones(4), scale=2.0)
    assert report.argument_bytes >= 16


def test_unknown_scheduler_is_reported():
    with pytest.raises(ValueError, match="unknown scheduler"):
        remat.analyze(jnp.sin, jnp.ones(3), scheduler="fastest")


def test_20000_equation_program_is_analyzed():
    # Its speed (<= 2 s) is a benchmark row (bench/bench_analyze.py), not a test:
    # timings on shared machines are noise.
    def chain(x):
        for _ in range(10_000):
            x = lax.cos(lax.sin(x))
        return x

    report = remat.analyze(chain, jnp.ones((8, 16)))
    assert len(report.graph.ops) == 20_000
    assert report.peak_bytes >= 2 * 8 * 16 * 4

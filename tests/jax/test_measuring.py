"""remat._jax.measuring: measuring compiles on worker threads, each read once."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from remat._jax import planner as planner_module
from remat._jax import program as program_module
from remat._jax.measuring import Pending


def test_a_compile_is_read_once_and_its_error_raised_where_it_is_read():
    pending = Pending()
    pending.start("a", lambda: 1)
    pending.start("a", lambda: 2)       # started already: the first one stands
    pending.start("b", lambda: 1 / 0)
    assert pending.take("a") == 1 and not pending.started("a")
    with pytest.raises(ZeroDivisionError):
        pending.take("b")
    pending.start("c", lambda: 3)
    pending.drop()
    assert not pending.started("c")


def _loss(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x * x)


def test_plans_compile_on_workers_and_none_is_left_after_an_answer(monkeypatch):
    threads = []
    compile_lowered = program_module.Program.compile_lowered

    def recording(self, lowered, measure_only=False):
        threads.append((threading.current_thread().name, measure_only))
        return compile_lowered(self, lowered, measure_only)

    monkeypatch.setattr(program_module.Program, "compile_lowered", recording)
    planner_module.forget_planners()
    keys = jax.random.split(jax.random.PRNGKey(11), 7)
    ws = [jax.random.normal(k, (128, 128)) / 11 for k in keys[:6]]
    x = jax.random.normal(keys[6], (256, 128))
    grad = jax.value_and_grad(_loss)
    plan = remat.plan(grad, ws, x, memory_limit=0.6)
    assert plan.met
    measuring = [name for name, quick in threads if quick]
    assert measuring and all(name.startswith("remat-compile") for name in measuring)
    [planner] = planner_module._PLANNERS.values()
    assert not planner._measuring.started(())   # read
    assert not planner._measuring._lowered      # those started ahead: read or dropped
    for got, want in zip(jax.tree.leaves(plan.compiled(ws, x)),
                         jax.tree.leaves(jax.jit(grad)(ws, x))):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_a_thread_local_setting_of_the_caller_holds_for_its_compiles():
    # the compiles run on worker threads; what the caller's context sets (here
    # 64-bit types) is in the lowered program, lowered on the caller's thread
    planner_module.forget_planners()
    with jax.enable_x64(True):
        keys = jax.random.split(jax.random.PRNGKey(12), 7)
        ws = [jax.random.normal(k, (128, 128), dtype=jnp.float64) / 11
              for k in keys[:6]]
        x = jax.random.normal(keys[6], (256, 128), dtype=jnp.float64)
        grad = jax.value_and_grad(_loss)
        plan = remat.plan(grad, ws, x, memory_limit=0.7)
        got, want = plan.compiled(ws, x), jax.jit(grad)(ws, x)
    assert plan.met
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == jnp.float64
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_on_one_core_nothing_compiles_ahead(monkeypatch):
    monkeypatch.setattr(planner_module, "cores", lambda: 1)
    planner_module.forget_planners()
    ws = [jnp.eye(64) * 0.5] * 3
    x = jnp.ones((128, 64))
    remat.plan(jax.value_and_grad(_loss), ws, x, memory_limit=0.9)
    [planner] = planner_module._PLANNERS.values()
    assert planner.frontier._compile_ahead is None


def _started_and_read(monkeypatch):
    """Records the keys of the measuring compiles started and of those read (a
    second core granted: on one, nothing compiles beside the plain program)."""
    monkeypatch.setattr(planner_module, "cores", lambda: 2)
    started, read = [], []
    measuring = planner_module.Measuring
    start, take = measuring.start, measuring.take
    monkeypatch.setattr(measuring, "start", lambda self, key, jaxpr: (
        started.append(key), start(self, key, jaxpr))[1])
    monkeypatch.setattr(measuring, "take", lambda self, key: (
        read.append(key), take(self, key))[1])
    return started, read


def _mlp_call(seed):
    keys = jax.random.split(jax.random.PRNGKey(seed), 7)
    ws = [jax.random.normal(k, (128, 128)) / 11 for k in keys[:6]]
    return jax.value_and_grad(_loss), ws, jax.random.normal(keys[6], (256, 128))


@pytest.mark.parametrize("limit", [0.8, 0.6])
def test_the_first_start_compiles_beside_the_plain_program_and_changes_no_answer(
        monkeypatch, limit):
    grad, ws, x = _mlp_call(13)
    planner_module.forget_planners()
    with monkeypatch.context() as m:
        m.setattr(planner_module.Planner, "_start_guessed", lambda self, limit: None)
        alone = remat.plan(grad, ws, x, memory_limit=limit)
    planner_module.forget_planners()
    started, read = _started_and_read(monkeypatch)
    plan = remat.plan(grad, ws, x, memory_limit=limit)
    # the plain program, then the first column's start, both before either is read
    assert started[0] == () and started[1] != () and read[0] == ()
    # the model's figure of this program puts it at XLA's start: the search reads it
    assert started[1] == read[1]
    assert (plan.planned, plan.extra_flops, plan.algorithm) == (
        alone.planned, alone.extra_flops, alone.algorithm)


def test_a_start_guessed_wrong_changes_no_answer(monkeypatch):
    # the model's figure without its arguments and outputs: its limit lands on a
    # lower rung than the search starts at (read later if a walk gets there)
    grad, ws, x = _mlp_call(14)
    planner_module.forget_planners()
    alone = remat.plan(grad, ws, x, memory_limit=0.6)
    planner_module.forget_planners()
    monkeypatch.setattr(program_module.Program, "held_bytes", lambda self: (0, 0, 0))
    started, read = _started_and_read(monkeypatch)
    plan = remat.plan(grad, ws, x, memory_limit=0.6)
    assert read[1] != started[1]
    [planner] = planner_module._PLANNERS.values()
    assert not planner._measuring._lowered
    assert (plan.planned, plan.extra_flops) == (alone.planned, alone.extra_flops)

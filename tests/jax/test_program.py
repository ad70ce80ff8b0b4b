"""program.py: tracing a call into a Program (the user's checkpoints included),
and compiling its rewrites."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import remat
from remat._jax.call import CallSpec
from remat._jax.planner import planner_for
from remat._jax.program import MEASURE_OPTIONS, trace_program
from remat._jax.xla_figures import XlaFootprint
from remat.core.options import resolve_options


def _mlp(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


def _conv(w, x):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = jax.nn.relu(y)
    y = jax.lax.conv_general_dilated(y, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.mean(y ** 2)


def _scanned(w, x):
    def body(h, _):
        return jnp.sin(h @ w), None
    return jnp.sum(jax.lax.scan(body, x, None, length=6)[0])


def _args(name):
    r = np.random.default_rng(0)
    if name == "mlp":
        return _mlp, ([jnp.asarray(r.normal(size=(256, 256)), jnp.float32)] * 4,
                      jnp.asarray(r.normal(size=(512, 256)), jnp.float32))
    if name == "conv":
        return _conv, (jnp.asarray(r.normal(size=(3, 3, 16, 16)), jnp.float32),
                       jnp.asarray(r.normal(size=(4, 32, 32, 16)), jnp.float32))
    return _scanned, (jnp.asarray(r.normal(size=(128, 128)), jnp.float32),
                      jnp.asarray(r.normal(size=(64, 128)), jnp.float32))


@pytest.mark.skipif(jax.default_backend() not in MEASURE_OPTIONS,
                    reason="no measuring options on this platform")
@pytest.mark.parametrize("name", ["mlp", "conv", "scan"])
def test_a_measuring_compile_reads_the_memory_of_a_full_one(name):
    fun, args = _args(name)
    grad = jax.value_and_grad(fun)
    program, _ = trace_program(grad, args, {}, CallSpec.of(grad, {}), {})
    fast = XlaFootprint.of(program.compile(program.flat, measure_only=True))
    full = XlaFootprint.of(program.compile(program.flat))
    assert fast == full


def test_the_platform_is_the_default_backend_without_shardings():
    program, _ = trace_program(_mlp, _args("mlp")[1], {}, CallSpec.of(_mlp, {}), {})
    assert program.platform() == jax.default_backend()


def _segmented(wrap):
    """``_mlp`` of 6 layers in 3 segments, each passed through ``wrap``."""
    def layers(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x
    segment = wrap(layers)

    def loss(ws, x):
        for k in range(0, len(ws), 2):
            x = segment(ws[k:k + 2], x)
        return jnp.sum(x ** 2)
    return jax.value_and_grad(loss)


def _segmented_args(seed):
    r = np.random.default_rng(seed)
    return ([jnp.asarray(r.normal(size=(128, 128)) / 11, jnp.float32) for _ in range(6)],
            jnp.asarray(r.normal(size=(512, 128)), jnp.float32))


def test_a_users_checkpoints_are_the_baseline_and_a_candidate_answer():
    """The program as written (its regions lowered as ``remat.checkpoint`` lowers
    them) is what fractional limits are of; the pass plans the program without
    the user's regions, and the program as written is a point of the frontier,
    its own recomputation counted."""
    step, args = _segmented(remat.checkpoint), _segmented_args(0)
    program, _ = trace_program(step, args, {}, CallSpec.of(step, {}), {})
    assert program.as_written is not None
    as_written = XlaFootprint.of(jax.jit(step).lower(*args).compile())
    without = XlaFootprint.of(program.compile(program.flat))
    assert as_written.total < without.total      # the user's regions save memory
    plan = remat.plan(step, *args, memory_limit=1.0)
    assert abs(plan.baseline.total - as_written.total) <= 0.01 * as_written.total
    assert plan.met and plan.planned.total <= as_written.total
    planner = planner_for(program, resolve_options({"memory_limit": 1.0}, {}))
    written = planner.frontier.points[("as written",)]
    assert written.footprint == plan.baseline.total and written.extra_flops > 0


@pytest.mark.parametrize("wrap", [remat.checkpoint, jax.checkpoint], ids=["remat", "jax"])
def test_a_users_checkpoints_do_not_change_what_a_byte_limit_gets(wrap):
    """The same flat program, the same plan: the user's regions neither hide
    recomputation from the planner nor count as recomputation it must repeat."""
    args, fresh = _segmented_args(1), _segmented_args(2)
    unwrapped = remat.plan(_segmented(lambda f: f), *args, memory_limit=0.6)
    wrapped = remat.jit(_segmented(wrap), memory_limit=unwrapped.limit_bytes)
    plan = wrapped.plan_for(*args)
    assert plan.met and plan.extra_flops == unwrapped.extra_flops
    got, want = wrapped(*fresh), jax.jit(_segmented(lambda f: f))(*fresh)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_step_that_changes_its_arguments_is_refused():
    # Like jax.jit, remat.jit returns only the results: the change would be lost.
    def step(state, x):
        state["w"] = state["w"] - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(
            state["w"])
        return jnp.sum(state["w"])

    state, x = {"w": jnp.ones((8, 8))}, jnp.ones((4, 8))
    with pytest.raises(ValueError, match=r"remat.jit: the function changed its "
                                         r"arguments \(argument leaf \[0\]\['w'\]\).*"
                                         r"Return the new state"):
        remat.plan(step, state, x, memory_limit=0.5)


def _train_step(donate: bool):
    """An SGD step on ``_mlp`` (the new parameters can take the donated old
    ones' buffers): the step, its jax.jit arguments, its arguments, its program."""
    def step(ws, x):
        grads = jax.grad(_mlp)(ws, x)
        return [w - 0.1 * g for w, g in zip(ws, grads)], jnp.sum(x)

    _, (ws, x) = _args("mlp")
    ws = [w + k for k, w in enumerate(ws)]      # distinct arrays
    kwargs = {"donate_argnums": (0,)} if donate else {}
    program, _ = trace_program(step, (ws, x), {}, CallSpec.of(step, dict(kwargs)), {})
    return step, kwargs, (ws, x), program


@pytest.mark.parametrize("donate", [False, True])
def test_held_bytes_are_xlas_arguments_outputs_and_aliased_bytes(donate):
    step, kwargs, args, program = _train_step(donate)
    xla = XlaFootprint.of(jax.jit(step, **kwargs).lower(*args).compile())
    argument, output, alias = program.held_bytes()
    assert (argument, alias) == (xla.argument, xla.alias)
    # XLA's outputs also hold the tuple of their addresses (8 bytes each)
    outputs = len(program.flat.jaxpr.outvars)
    assert 0 <= xla.output - output <= 8 * outputs
    assert (xla.alias > 0) == donate


def test_a_closed_over_typed_key_is_a_constant_of_the_program():
    # a typed PRNG key has no NumPy form; the digest reads its bits, so two keys
    # are two programs and the same key is one
    def step(key):
        def loss(ws, x):
            for w in ws:
                x = jnp.tanh(x @ w) * jax.random.bernoulli(key, 0.9, x.shape)
            return jnp.sum(x ** 2)
        return jax.value_and_grad(loss)

    ws, x = _args("mlp")[1]
    keys = jax.random.split(jax.random.key(0), 2)
    programs = [trace_program(step(k), (ws, x), {}, CallSpec(), {})[0] for k in
                (keys[0], keys[1], keys[0])]
    assert programs[0].key != programs[1].key and programs[0].key == programs[2].key
    got = remat.jit(step(keys[1]), memory_limit=0.8)(ws, x)
    want = jax.jit(step(keys[1]))(ws, x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


@pytest.mark.parametrize("donate", [False, True])
def test_a_plan_lowered_from_the_plain_programs_trace_is_the_traced_one(donate):
    # Program.lower reuses jax.jit's trace of the plain program for each plan
    # (same inputs and outputs): the module must be the one a fresh trace gives
    from remat._jax.compat import core, traced_as
    from remat._jax.rewrite import rewrite_jaxpr
    from remat.core.algorithms import get_algorithm
    from remat.core.options import RematOptions
    from remat.core.scheduled import on_schedule

    program = _train_step(donate)[3]
    scheduled = on_schedule(program.graph, tuple(range(program.graph.num_ops)))
    peak = scheduled.timeline.peak_bytes
    result = get_algorithm("path")(scheduled, RematOptions(int(0.8 * peak), "path"))
    assert result.regions
    closed = core.ClosedJaxpr(rewrite_jaxpr(program.flat.jaxpr, result.rewritten),
                              program.flat.consts)
    traced = program.function(closed).lower(*program.specs).as_text()
    assert program.lower(program.flat).as_text() == program.function(
        program.flat).lower(*program.specs).as_text()
    assert program.lower(closed).as_text() == traced
    assert traced_as(program._template[1], closed) is not None     # (the shortcut)

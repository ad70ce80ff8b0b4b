"""Planning inside differentiated loops: limits met in XLA's figures, gradients
unchanged, programs without loops planned as before."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import remat
from remat._jax import auto
from remat._jax.call import CallSpec
from remat._jax.compat import core
from remat._jax.inline import inline_calls
from remat._jax.loop_plan import LoopPlan, _cheapest_within
from remat._jax.loop_split import segment_sizes, split_loops
from remat._jax.loops import find_loops, loop_body, rewrite_loops
from remat._jax.planner import forget_planners
from remat._jax.program import trace_program
from remat.core.loops import loop_choices

LAYERS, BATCH, WIDTH = 8, 256, 128


def _footprint(compiled):
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes +
            m.temp_size_in_bytes - m.alias_size_in_bytes)


def _mlp_loss(ws, x):
    def body(c, w):
        return jnp.tanh(jnp.tanh(c @ w) @ w.T) + c, None
    return jnp.mean(jax.lax.scan(body, x, ws)[0] ** 2)


def _mlp_inputs(seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return (jax.random.normal(k1, (LAYERS, WIDTH, WIDTH)) / np.sqrt(WIDTH),
            jax.random.normal(k2, (BATCH, WIDTH)))


SEQ, HEADS = 32, 4


def _block(x, p):
    def norm(h):
        m = h.mean(-1, keepdims=True)
        return (h - m) * jax.lax.rsqrt(((h - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    b, s, d = x.shape
    split = lambda t: t.reshape(b, s, HEADS, d // HEADS)
    h = norm(x)
    q, k, v = split(h @ p["wq"]), split(h @ p["wk"]), split(h @ p["wv"])
    a = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // HEADS), -1)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, s, d) @ p["wo"]
    return x + jax.nn.gelu(norm(x) @ p["w1"]) @ p["w2"], None


def _transformer_loss(params, x):
    return jnp.mean(jax.lax.scan(_block, x, params)[0] ** 2)


def _transformer_inputs(seed, layers=4, batch=4, width=64):
    keys = jax.random.split(jax.random.key(seed), 7)
    shapes = {"wq": (width, width), "wk": (width, width), "wv": (width, width),
              "wo": (width, width), "w1": (width, 4 * width), "w2": (4 * width, width)}
    params = {n: jax.random.normal(k, (layers, *s)) / np.sqrt(s[0])
              for k, (n, s) in zip(keys, shapes.items())}
    return params, jax.random.normal(keys[-1], (batch, SEQ, width))


def _check(fun, args, fraction):
    """remat.jit of ``fun`` at ``fraction`` of its temporaries: met in XLA's
    figure of a fresh compile, outputs equal the plain program's."""
    plain = jax.jit(fun).lower(*args).compile()
    step = remat.jit(fun, memory_limit=fraction)
    plan = step.plan_for(*args)
    assert isinstance(plan, LoopPlan) and plan.met
    assert any(d.rebuilt for d in plan.loops)
    assert plan.compiles >= 1 and plan.compile_seconds > 0   # the loop choices' count
    assert _footprint(step.lower(*args).compile()) <= plan.limit_bytes < _footprint(plain)
    for got, want in zip(jax.tree.leaves(step(*args)), jax.tree.leaves(plain(*args))):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    return plan


@pytest.mark.parametrize("fraction", [0.5, 0.3])
def test_scanned_mlp(fraction):
    plan = _check(jax.value_and_grad(_mlp_loss), _mlp_inputs(1), fraction)
    text = str(plan)
    assert "loop at" in text and f"({LAYERS} iterations)" in text and "rebuilds" in text
    # the summary says the loops were planned, not only the rest ("by plain")
    assert f"by the loop choice below, then {plan.algorithm} on the rest" in text


@pytest.mark.parametrize("fraction", [0.5, 0.3])
def test_scanned_transformer(fraction):
    _check(jax.value_and_grad(_transformer_loss), _transformer_inputs(2), fraction)


@pytest.mark.parametrize("fraction", [0.5, 0.3])
def test_train_step_with_optax(fraction):
    ws, x = _mlp_inputs(3)
    opt = optax.adam(1e-3)

    def train_step(ws, state, x):
        loss, grads = jax.value_and_grad(_mlp_loss)(ws, x)
        updates, state = opt.update(grads, state, ws)
        return optax.apply_updates(ws, updates), state, loss

    _check(train_step, (ws, opt.init(ws), x), fraction)


def test_fori_loop_with_static_bounds():
    w, x = _mlp_inputs(4)

    def loss(w, x):
        step = lambda i, c: jnp.tanh(jnp.tanh(c @ w[0]) @ w[1]) * (1.0 + 0.01 * i)
        return jnp.sum(jax.lax.fori_loop(0, LAYERS, step, x) ** 2)

    _check(jax.grad(loss), (w, x), 0.5)


def test_a_residual_that_is_the_next_carry_may_be_rebuilt():
    """``tanh``'s derivative reads its result, which here is also the carry out:
    stacked as a residual, it can be rebuilt from the carry in, so the pass
    reaches what checkpointing the body by hand does (only the carry stacked)."""
    def loss(wrap):
        def body(c, w):
            return wrap(lambda c, w: jnp.tanh(jnp.tanh(c @ w) @ w))(c, w), None
        return jax.value_and_grad(
            lambda ws, x: jnp.sum(jax.lax.scan(body, x, ws)[0] ** 2))

    ws, x = _mlp_inputs(9)
    flat = inline_calls(jax.make_jaxpr(loss(lambda f: f))(ws, x))
    (pair,) = find_loops(flat.jaxpr)
    fwd = flat.jaxpr.eqns[pair.forward].params["jaxpr"].jaxpr
    carry_out = fwd.outvars[0]
    bmap = loop_body(flat.jaxpr, pair)
    assert any(bmap.vars[r] is carry_out for r in bmap.body.residuals)
    by_hand = _footprint(jax.jit(loss(remat.checkpoint)).lower(ws, x).compile())
    plan = remat.plan(loss(lambda f: f), ws, x, memory_limit=by_hand)
    assert plan.met


def test_a_residual_the_loop_also_returns_may_be_rebuilt():
    """An RNN returning its states stacks each state twice: as the loop's output
    (read by the loss, in the forward pass) and as the residual of ``tanh``.
    Rebuilt from the carry in, the residual leaves the backward loop, and the
    states' stack goes once the loss has read it: the pass reaches what
    checkpointing the cell by hand does, with gradients equal to the plain ones."""
    def loss(wrap):
        def body(c, w):
            c = wrap(lambda c, w: jnp.tanh(c @ w))(c, w)
            return c, c
        return jax.value_and_grad(
            lambda ws, x: jnp.mean(jax.lax.scan(body, x, ws)[1] ** 2))

    ws, x = _mlp_inputs(10)
    flat = inline_calls(jax.make_jaxpr(loss(lambda f: f))(ws, x))
    (pair,) = find_loops(flat.jaxpr)
    fwd = flat.jaxpr.eqns[pair.forward]
    states = fwd.params["jaxpr"].jaxpr.outvars[fwd.params["num_carry"]]
    bmap = loop_body(flat.jaxpr, pair)
    assert any(bmap.vars[r] is states for r in bmap.body.residuals)
    plain = _footprint(jax.jit(loss(lambda f: f)).lower(ws, x).compile())
    by_hand = _footprint(jax.jit(loss(remat.checkpoint)).lower(ws, x).compile())
    assert by_hand < plain
    plan = remat.plan(loss(lambda f: f), ws, x, memory_limit=by_hand)
    assert plan.met
    want = jax.jit(loss(lambda f: f))(ws, x)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(plan.compiled(ws, x))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_every_choice_gives_the_plain_gradient():
    ws, x = _mlp_inputs(5)
    flat = inline_calls(jax.make_jaxpr(jax.grad(_mlp_loss, argnums=(0, 1)))(ws, x))
    pairs = find_loops(flat.jaxpr)
    assert len(pairs) == 1 and len(pairs[0].positions) == 6
    bmap = loop_body(flat.jaxpr, pairs[0])
    front = loop_choices(bmap.body)
    want = core.jaxpr_as_fun(flat)(ws, x)
    sizes = []
    for choice in front:
        closed = core.ClosedJaxpr(rewrite_loops(flat.jaxpr, pairs, [bmap], [choice]),
                                  flat.consts)
        compiled = jax.jit(core.jaxpr_as_fun(closed)).lower(ws, x).compile()
        sizes.append(_footprint(compiled))
        for got, w in zip(compiled(ws, x), want):
            np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)
    # What the model frees, XLA frees too: memory falls along the frontier.
    assert all(a > b for a, b in zip(sizes, sizes[1:]))
    assert sizes[0] - sizes[-1] >= LAYERS * 4 * BATCH * WIDTH * 4


def test_programs_without_loops_plan_as_before():
    ws = [jnp.eye(128) * 0.9] * 8
    x = jnp.ones((512, 128))

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x ** 2)

    options = auto._options(dict(memory_limit=0.7))
    program, _ = trace_program(jax.grad(loss), (ws, x), {}, CallSpec(), {})
    flat = auto._plan_traced(program, options, CallSpec())
    forget_planners()       # the plan below searches afresh
    plan = remat.plan(jax.grad(loss), ws, x, memory_limit=0.7)
    assert type(plan) is auto.Plan
    assert plan.result.regions == flat.result.regions
    assert plan.planned.total == flat.planned.total


def test_unreachable_limit_names_the_loops():
    ws, x = _mlp_inputs(6)
    with pytest.raises(remat.MemoryLimitError, match="differentiated loop"):
        remat.plan(jax.grad(_mlp_loss), ws, x, memory_limit=0.01)


def test_the_next_choice_is_taken_when_the_rest_cannot_be_planned(monkeypatch):
    # A choice its measuring compile reads within the limit may read over in full
    # (by kilobytes); the rest of the program then cannot be planned under it.
    ws, x = _mlp_inputs(7)
    tried = []
    real = auto._plan_traced

    def refuse_first(program, options, spec):
        tried.append(program.key[1])           # ("loops", choice, split)
        if len(tried) == 1:
            raise remat.MemoryLimitError("refused for the test", 1, 2, 0)
        return real(program, options, spec)

    monkeypatch.setattr(auto, "_plan_traced", refuse_first)
    plan = remat.plan(jax.grad(_mlp_loss), ws, x, memory_limit=0.6)
    assert plan.met and [t[1] for t in tried] == [tried[0][1], tried[0][1] + 1]


@pytest.mark.parametrize("first_met", range(10))
@pytest.mark.parametrize("model_pick", [0, 3, 9])
def test_cheapest_within_finds_the_first_met_choice(first_met, model_pick):
    read = []

    def footprint(k):
        read.append(k)
        return 100 - k if k >= first_met else 200

    predicted = [1000] * model_pick + [0] * (10 - model_pick)
    assert _cheapest_within(footprint, predicted, 100 - first_met) == first_met
    assert len(set(read)) <= 9
    assert _cheapest_within(footprint, predicted, 0) == 9     # none met: the last


def test_split_loops_keep_gradients_and_stack_less():
    ws, x = _mlp_inputs(7)
    ws = jnp.concatenate([ws, ws[::-1]])                    # 16 iterations
    flat = inline_calls(jax.make_jaxpr(jax.grad(_mlp_loss, argnums=(0, 1)))(ws, x))
    pairs = find_loops(flat.jaxpr)
    bmap = loop_body(flat.jaxpr, pairs[0])
    carry_only = core.ClosedJaxpr(rewrite_loops(
        flat.jaxpr, pairs, [bmap], [loop_choices(bmap.body)[-1]]), flat.consts)
    assert segment_sizes(16) == [4, 2, 8] and segment_sizes(7) == []
    want = core.jaxpr_as_fun(flat)(ws, x)
    sizes = {}
    for name, closed in [("as written", flat), ("carry only", carry_only)]:
        for size in (None, 4):
            if size:
                closed = split_loops(closed, {find_loops(closed.jaxpr)[0]: size})
            compiled = jax.jit(core.jaxpr_as_fun(closed)).lower(ws, x).compile()
            sizes[name, size] = _footprint(compiled)
            for got, w in zip(compiled(ws, x), want):
                np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)
    assert sizes["as written", 4] < sizes["as written", None]
    assert sizes["carry only", 4] < sizes["carry only", None]
    with pytest.raises(ValueError, match="size must divide"):
        split_loops(flat, {pairs[0]: 3})
    # Below what any choice stacking per iteration reaches: the pass splits.
    grad = jax.grad(_mlp_loss, argnums=(0, 1))
    plan = remat.plan(grad, ws, x, memory_limit=sizes["carry only", None] - 1)
    assert plan.met and plan.loops[0].split in segment_sizes(16)
    assert "segments of" in str(plan)
    for got, w in zip(plan.compiled(ws, x), want):
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)


def test_docstring_examples():
    import doctest
    from remat._jax import loops
    result = doctest.testmod(loops, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_flax_scan_unchanged_meets_half_and_names_the_users_line():
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            return x + nn.Dense(64)(jnp.tanh(nn.Dense(128)(x))), None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            stack = nn.scan(Block, variable_axes={"params": 0},
                            split_rngs={"params": True}, length=6)
            x, _ = stack(name="blocks")(x, None)
            return jnp.sum(x ** 2)

    x = jax.random.normal(jax.random.key(1), (256, 64))
    model = Model()
    params = model.init(jax.random.key(0), x)
    grad = jax.grad(lambda p, x: model.apply(p, x))
    plan = remat.plan(grad, params, x, memory_limit=0.5)
    assert plan.met and plan.loops and plan.loops[0].rebuilt
    assert "test_loops.py" in plan.loops[0].source     # not flax's own scan
    assert plan.memlog().startswith("# loop at ")      # the dumps name the loops
    assert 'label="loop at ' in plan.to_dot()
    want, got = jax.jit(grad)(params, x), plan.compiled(params, x)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)


def test_an_equinox_scanned_stack_unchanged_meets_half_and_a_third():
    eqx = pytest.importorskip("equinox")

    class Block(eqx.Module):
        up: eqx.nn.Linear
        down: eqx.nn.Linear

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.up, self.down = eqx.nn.Linear(64, 128, key=k1), eqx.nn.Linear(128, 64, key=k2)

        def __call__(self, x):
            return x + jax.vmap(self.down)(jnp.tanh(jax.vmap(self.up)(x)))

    # Equinox's scan-over-layers pattern: the blocks made by filter_vmap, their
    # arrays stacked, the rest static, recombined inside the scan body.
    blocks = eqx.filter_vmap(Block)(jax.random.split(jax.random.key(0), 12))
    arrays, static = eqx.partition(blocks, eqx.is_array)

    def loss(arrays, x):
        def body(h, layer):
            return eqx.combine(layer, static)(h), None
        return jnp.sum(jax.lax.scan(body, x, arrays)[0] ** 2)

    x = jax.random.normal(jax.random.key(1), (256, 64))
    grad = jax.grad(loss)
    want = jax.jit(grad)(arrays, x)
    for fraction in (0.5, 0.3):
        plan = remat.plan(grad, arrays, x, memory_limit=fraction)
        assert plan.met and plan.loops, fraction
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(plan.compiled(arrays, x))):
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)

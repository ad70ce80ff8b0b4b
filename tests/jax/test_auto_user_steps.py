"""remat.jit on training steps as users write them, beyond one value_and_grad:
two gradients in one step, per-example gradients, a custom VJP, accumulation in
a fori_loop, a stop-gradient target, auxiliary integer outputs, layers that
branch (lax.cond). Each step meets 75% of its temporaries or the least footprint
its refusal names, with XLA's footprint within the limit and results equal to
jax.jit's."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import remat

WIDTHS = (128, 384, 384, 384, 384, 10)
BATCH = 512


def _params(seed):
    rng = np.random.default_rng(seed)
    return [dict(w=jnp.asarray(rng.normal(size=(a, b)) / np.sqrt(a), jnp.float32),
                 b=jnp.asarray(rng.normal(size=b) * 0.1, jnp.float32))
            for a, b in zip(WIDTHS[:-1], WIDTHS[1:])]


def _mlp(ps, x, act=jax.nn.gelu):
    for i, p in enumerate(ps):
        x = x @ p["w"] + p["b"]
        x = act(x) if i < len(ps) - 1 else x
    return x


def _xent(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _checkpointed_mlp(ps, x):
    # each layer under remat.checkpoint, as a user would segment it by hand
    for i, p in enumerate(ps):
        last = i == len(ps) - 1
        x = remat.checkpoint(lambda x, p, last=last: _mlp([p], x) if last
                             else jax.nn.gelu(x @ p["w"] + p["b"]))(x, p)
    return x


def _sharpness_aware(ps, x, y, mlp=_mlp):
    # SAM: a gradient, then the gradient at the weights it moved
    loss = lambda p: _xent(mlp(p, x), y)
    g = jax.grad(loss)(ps)
    norm = optax.tree.norm(g)
    moved = jax.tree.map(lambda w, d: w + 0.05 * d / norm, ps, g)
    return jax.value_and_grad(loss)(moved)


def _per_example_clipped(ps, x, y):
    # DP-SGD: per-example gradients (vmap of grad), clipped, averaged
    one = lambda p, xi, yi: _xent(_mlp(p, xi[None]), yi[None])
    g = jax.vmap(jax.grad(one), in_axes=(None, 0, 0))(ps, x[:32], y[:32])
    norms = jnp.sqrt(sum(jnp.sum(l.reshape(32, -1) ** 2, 1) for l in jax.tree.leaves(g)))
    scale = jnp.minimum(1.0, 1.0 / (norms + 1e-6))
    return jax.tree.map(lambda l: jnp.tensordot(scale, l, 1) / 32, g)


@jax.custom_vjp
def _clip_gradient(x):
    return x


_clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.01, 0.01),))


def _custom_vjp(ps, x, y):
    act = lambda h: _clip_gradient(jnp.tanh(h))
    return jax.value_and_grad(lambda p: _xent(_mlp(p, x, act), y))(ps)


def _accumulated(ps, x, y):
    xs, ys = x.reshape(4, BATCH // 4, -1), y.reshape(4, BATCH // 4)

    def body(i, acc):
        g = jax.grad(lambda p: _xent(_mlp(p, xs[i]), ys[i]))(ps)
        return jax.tree.map(jnp.add, acc, g)
    return jax.lax.fori_loop(0, 4, body, jax.tree.map(jnp.zeros_like, ps))


def _target_network(ps, x, y):
    target = jax.lax.stop_gradient(jax.nn.softmax(_mlp(jax.tree.map(jnp.flip, ps), x)))
    loss = lambda p: -jnp.mean(jnp.sum(target * jax.nn.log_softmax(_mlp(p, x)), -1))
    return jax.value_and_grad(loss)(ps)


def _with_metrics(ps, x, y):
    def loss(p):
        logits = _mlp(p, x)
        pred = jnp.argmax(logits, -1)
        return _xent(logits, y), dict(accuracy=jnp.mean(pred == y), pred=pred)
    return jax.value_and_grad(loss, has_aux=True)(ps)


def _conditional(ps, x, y, wrap=lambda layer: layer):
    # each hidden layer's activation picked by a data-dependent branch
    def layer(h, p):
        z = h @ p["w"] + p["b"]
        return jax.lax.cond(jnp.mean(z) > 0, jnp.tanh, jax.nn.relu, z)

    def loss(p):
        h = x
        for q in p[:-1]:
            h = wrap(layer)(h, q)
        return _xent(h @ p[-1]["w"] + p[-1]["b"], y)
    return jax.value_and_grad(loss)(ps)


STEPS = dict(sharpness_aware=_sharpness_aware, per_example_clipped=_per_example_clipped,
             custom_vjp=_custom_vjp, accumulated=_accumulated,
             target_network=_target_network, with_metrics=_with_metrics,
             conditional=_conditional)


def _args():
    rng = np.random.default_rng(1)
    return (_params(2), jnp.asarray(rng.normal(size=(BATCH, WIDTHS[0])), jnp.float32),
            jnp.asarray(rng.integers(0, WIDTHS[-1], BATCH)))


def _footprint(step, args):
    m = jax.jit(step).lower(*args).compile().memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes
            + m.temp_size_in_bytes - m.alias_size_in_bytes)


@pytest.mark.parametrize("name", STEPS)
def test_a_users_step_is_met_or_refused_with_a_least_that_is_met(name):
    # at 75% of its temporaries, or where refused there, at the least footprint
    # the refusal names (its promise: "a limit of N bytes or more is met")
    step = STEPS[name]
    args = _args()
    want = jax.jit(step)(*args)
    try:
        plan = remat.plan(step, *args, memory_limit=0.75)
    except remat.MemoryLimitError as refused:
        assert refused.limit_bytes < refused.least_bytes
        plan = remat.plan(step, *args, memory_limit=refused.least_bytes)
    assert plan.planned.total <= plan.limit_bytes <= plan.baseline.total
    got = plan.compiled(*args)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-6)


def test_sharpness_aware_meets_a_limit_halfway_to_its_hand_segmentation():
    # XLA computes each layer's bias add again inside every backward fusion that
    # reads it; the model, once it reads that back from the plain compile, plans
    # drops XLA follows (before, every plan dropped only what XLA never held,
    # and the least reached was a few percent under the plain step)
    args = _args()
    plain = _footprint(_sharpness_aware, args)
    hand = _footprint(lambda *a: _sharpness_aware(*a, mlp=_checkpointed_mlp), args)
    assert hand < 0.8 * plain
    plan = remat.plan(_sharpness_aware, *args, memory_limit=(plain + hand) // 2)
    assert plan.met
    want = jax.jit(_sharpness_aware)(*args)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(plan.compiled(*args))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-6)


def test_branching_layers_meet_their_hand_checkpoints_footprint():
    # the branch (a conditional) is what each layer keeps for the backward; the
    # pass runs it again, as a checkpoint around each layer does by hand
    args = _args()
    hand = _footprint(lambda *a: _conditional(*a, wrap=remat.checkpoint), args)
    assert hand < 0.8 * _footprint(_conditional, args)
    plan = remat.plan(_conditional, *args, memory_limit=hand)
    assert plan.met and plan.extra_flops > 0
    want = jax.jit(_conditional)(*args)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(plan.compiled(*args))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-6)


def test_a_branch_with_an_effect_runs_once_per_step():
    # a conditional whose branch calls back into Python is never run twice; where
    # nothing else can be, the least footprint a refusal names is met when asked
    calls = []
    record = lambda v: calls.append(float(v))

    def step(ps, x, y):
        def loss(p):
            h = x
            for q in p[:-1]:
                z = h @ q["w"] + q["b"]
                h = jax.lax.cond(jnp.mean(z) > 0, lambda z: (
                    jax.debug.callback(record, z[0, 0]), jnp.tanh(z))[1], jax.nn.relu, z)
            return _xent(h @ p[-1]["w"] + p[-1]["b"], y)
        return jax.value_and_grad(loss)(ps)

    args = _args()
    jax.block_until_ready(jax.jit(step)(*args))
    once, calls[:] = len(calls), []
    try:
        plan = remat.plan(step, *args, memory_limit=0.5)
    except remat.MemoryLimitError as refused:
        plan = remat.plan(step, *args, memory_limit=refused.least_bytes)
    calls.clear()
    jax.block_until_ready(plan.compiled(*args))
    assert once > 0 and len(calls) == once


def test_a_vmapped_ensemble_meets_its_hand_segmentation():
    # four models at once (jax.vmap of value_and_grad): two layers per checkpoint
    # reach 3.80 MB; without vmap, the same models planned one by one beat that
    rng = np.random.default_rng(0)
    ws = jnp.asarray(rng.normal(size=(4, 128, 128)) / np.sqrt(128), jnp.float32)
    x = jnp.asarray(rng.normal(size=(256, 128)) / np.sqrt(128), jnp.float32)

    def ensemble(layers_per_checkpoint=None):
        def one(w, x):
            h = x
            if layers_per_checkpoint is None:
                for _ in range(6):
                    h = jnp.tanh(h @ w)
            else:
                segment = remat.checkpoint(lambda h, w: jnp.tanh(jnp.tanh(h @ w) @ w))
                for _ in range(3):
                    h = segment(h, w)
            return jnp.mean(h ** 2)
        return jax.vmap(jax.value_and_grad(one), in_axes=(0, None))

    hand = _footprint(ensemble(2), (ws, x))
    assert hand < _footprint(ensemble(), (ws, x))
    assert remat.plan(ensemble(), ws, x, memory_limit=hand).met

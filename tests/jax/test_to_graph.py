import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from remat._jax.to_graph import jaxpr_to_graph


def labels(graph):
    return [op.label for op in graph.ops]


def test_values_carry_bytes_shapes_and_sources():
    g = jaxpr_to_graph(jax.make_jaxpr(lambda x: jnp.sin(x) @ x)(jnp.ones((4, 4))))
    assert labels(g) == ["sin", "dot_general"]
    assert len(g.inputs) == 1 and g.values[g.inputs[0]].nbytes == 64
    out = g.values[g.outputs[0]]
    assert out.nbytes == 64 and "4,4" in out.shape
    assert "test_to_graph.py" in g.ops[0].source
    assert g.ops[0].fusion == "loop" and g.ops[1].fusion == "none"
    assert g.ops[1].flops == 2 * 4 * 4 * 4
    assert g.ops[0].transcendentals == 16


def test_jit_and_custom_derivative_calls_are_inlined_recursively():
    @jax.jit
    def inner(x):
        return jnp.cos(x) * 2

    @jax.custom_jvp
    def f(x):
        return jnp.exp(x)

    f.defjvp(lambda p, t: (f(p[0]), f(p[0]) * t[0]))

    @jax.custom_vjp
    def h(x):
        return jnp.tanh(x)

    h.defvjp(lambda x: (jnp.tanh(x), x), lambda r, g: (g,))

    def prog(x):
        return jax.jit(lambda y: inner(y) + f(y) + h(y))(x)

    g = jaxpr_to_graph(jax.make_jaxpr(prog)(jnp.ones(3)))
    assert {"cos", "exp", "tanh", "mul", "add"} <= set(labels(g))
    assert not {"jit", "pjit", "custom_jvp_call", "custom_vjp_call"} & set(labels(g))


def test_remat_bodies_are_inlined_in_gradients():
    def loss(x):
        return jnp.sum(jax.checkpoint(lambda y: jnp.sin(jnp.sin(y)))(x))

    g = jaxpr_to_graph(jax.make_jaxpr(jax.grad(loss))(jnp.ones(3)))
    assert "remat2" not in labels(g) and "checkpoint" not in labels(g)
    assert "sin" in labels(g)


def test_control_flow_stays_one_op_with_a_working_set_and_cost():
    def body(carry, x):
        t = jnp.tanh(carry @ jnp.ones((32, 32)))
        return t * x, jnp.sum(t)

    def prog(c, xs):
        c, ys = lax.scan(body, c, xs)
        c = lax.cond(ys[0] > 0, lambda v: v + 1, lambda v: jnp.exp(v), c)
        c = lax.while_loop(lambda v: jnp.sum(v) < 10, lambda v: v * 2, c)
        return c, ys

    g = jaxpr_to_graph(jax.make_jaxpr(prog)(jnp.ones((8, 32)), jnp.ones(5)))
    by_label = {op.label: op for op in g.ops}
    assert {"scan", "cond", "while"} <= set(by_label)
    scan = by_label["scan"]
    assert scan.flops >= 5 * 2 * 8 * 32 * 32  # length x the body's dot
    assert scan.working_set_bytes >= 8 * 32 * 4  # the body's tanh temporary
    assert by_label["cond"].transcendentals == 8 * 32  # the costlier branch


def test_a_conditional_is_repeatable_unless_a_branch_has_effects_or_draws():
    # a conditional may run twice where its branches may; a print, a ref write or
    # a draw from XLA's generator in a branch rules it out (the core never
    # recomputes an op that is not repeatable)
    from remat.core.algorithms.recomputable import recomputable

    def prog(x, key):
        pure = lax.cond(x[0] > 0, jnp.tanh, jnp.sin, x)
        printed = lax.cond(x[1] > 0, lambda v: v + 1,
                           lambda v: (jax.debug.print("{}", v[0]), v * 2)[1], x)
        drawn = lax.cond(x[2] > 0, lambda v: v + lax.rng_bit_generator(key, v.shape)[1]
                         .astype(v.dtype), lambda v: v, x)
        return pure + printed + drawn

    g = jaxpr_to_graph(jax.make_jaxpr(prog)(jnp.ones(8), jnp.zeros(4, jnp.uint32)))
    conds = [k for k, op in enumerate(g.ops) if op.label == "cond"]
    assert [g.ops[k].repeatable for k in conds] == [True, False, False]
    assert [recomputable(g, k) for k in conds] == [True, False, False]


def test_literals_are_not_values_and_constants_become_inputs():
    table = np.arange(6, dtype=np.float32)

    def prog(x):
        return x * 3.0 + jnp.asarray(table)

    closed = jax.make_jaxpr(prog)(jnp.ones(6))
    g = jaxpr_to_graph(closed)
    assert len(g.inputs) == 1 + len(closed.consts)
    assert all(len(op.inputs) <= 2 for op in g.ops)
    if closed.consts:
        assert g.values[g.inputs[1]].name == "const"
        assert g.values[g.inputs[1]].nbytes == 24


def test_dead_code_is_dropped():
    def prog(x):
        unused = jnp.exp(x) * 5
        del unused
        return jnp.sin(x)

    g = jaxpr_to_graph(jax.make_jaxpr(prog)(jnp.ones(3)))
    assert labels(g) == ["sin"]


def test_donation_flags_are_checked_and_recorded():
    closed = jax.make_jaxpr(lambda a, b: a + b)(jnp.ones(3), jnp.ones(3))
    g = jaxpr_to_graph(closed, donated=[True, False])
    assert g.donated == frozenset({g.inputs[0]})
    with pytest.raises(ValueError, match="one flag per input"):
        jaxpr_to_graph(closed, donated=[True])


def test_convolution_flops():
    x = jnp.ones((2, 8, 8, 3))
    w = jnp.ones((3, 3, 3, 5))
    prog = lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    g = jaxpr_to_graph(jax.make_jaxpr(prog)(x, w))
    (conv,) = g.ops
    assert conv.flops == 2 * (2 * 8 * 8 * 5) * (3 * 3 * 3)


def test_half_precision_matmuls_can_be_modelled_as_xla_cpu_runs_them():
    w = jnp.ones((8, 8), jnp.bfloat16)
    x = jnp.ones((4, 8), jnp.bfloat16)
    closed = jax.make_jaxpr(lambda w, x: (x @ w) @ w)(w, x)
    plain = jaxpr_to_graph(closed)
    assert labels(plain) == ["dot_general", "dot_general"]
    upcast = jaxpr_to_graph(closed, upcast_half_precision_matmuls=True)
    # one f32 copy per 16-bit operand (w's is shared by both dots), f32 dots,
    # converts back to bf16
    assert labels(upcast).count("convert_element_type") == 2 + 2 + 1
    dots = [op for op in upcast.ops if op.label == "dot_general"]
    assert [upcast.values[v].nbytes for op in dots for v in op.outputs] == [128, 128]
    w_copy = dots[0].inputs[1]
    assert dots[1].inputs[1] == w_copy and upcast.values[w_copy].nbytes == 256
    assert upcast.values[upcast.outputs[0]].nbytes == 64


def test_repeated_computations_are_merged_as_xla_cse_would():
    def prog(x):
        return jnp.sin(x) * jnp.sin(x) + jnp.sin(x + 1.0) * jnp.sin(x + 1.0)

    closed = jax.make_jaxpr(prog)(jnp.ones(3))
    assert labels(jaxpr_to_graph(closed)).count("sin") == 4  # off by default
    g = jaxpr_to_graph(closed, merge_repeated=True)
    assert labels(g).count("sin") == 2  # sin(x) and sin(x + 1)
    assert labels(g).count("add") == 2


def test_checkpointed_recomputation_is_merged_with_the_forward():
    def loss(x):
        return jnp.sum(jax.checkpoint(lambda y: jnp.sin(jnp.sin(y)))(x))

    g = jaxpr_to_graph(jax.make_jaxpr(jax.grad(loss))(jnp.ones(3)), merge_repeated=True)
    assert labels(g).count("sin") == 1  # the recomputed sin is the forward one


def test_a_max_pool_backward_keeps_its_operand():
    # the graph of a max-pool's gradient reads the pooled value as operand 1 of
    # select_and_scatter_add, whose producer the planners then never recompute
    from remat.core.algorithms.recomputable import recomputable

    def loss(x):
        h = jnp.tanh(x)
        return jnp.sum(lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1),
                                         (1, 2, 2, 1), "VALID") ** 2)

    g = jaxpr_to_graph(jax.make_jaxpr(jax.grad(loss))(jnp.ones((2, 8, 8, 3))))
    [pool_grad] = [o for o in g.ops if o.label == "select_and_scatter_add"]
    kept = g.values[pool_grad.inputs[1]].producer
    assert g.ops[kept].label == "tanh" and not recomputable(g, kept)
    assert recomputable(g, labels(g).index("reduce_window_max"))

"""remat._jax.xla_fusion: equations named in XLA's program, and those it never stores."""

import re

import jax
import jax.numpy as jnp
import numpy as np

from remat._jax.call import CallSpec
from remat._jax.program import trace_program
from remat._jax.xla_fusion import copied_equations, tag_equations


def _gelu_mlp_grad(params, x):
    def loss(params):
        h = x
        for w, b in params:
            h = jax.nn.gelu(h @ w + b)
        return jnp.sum(h * h)
    return jax.grad(loss)(params)


def _program():
    rng = np.random.default_rng(0)
    params = [(jnp.asarray(rng.normal(size=(64, 64)) / 8, jnp.float32),
               jnp.asarray(rng.normal(size=64), jnp.float32)) for _ in range(3)]
    x = jnp.asarray(rng.normal(size=(128, 64)), jnp.float32)
    program, _ = trace_program(_gelu_mlp_grad, (params, x), {}, CallSpec.of(
        _gelu_mlp_grad, {}), {})
    return program, jax.tree.leaves((params, x))


def test_a_tagged_program_computes_the_same_and_names_each_equation():
    program, leaves = _program()
    tagged = tag_equations(program.flat)
    compiled = program.lower(tagged).compile()
    text = compiled.as_text()
    eqns = program.flat.jaxpr.eqns
    # each instruction a dot made names that dot's equation
    named = [int(i) for i in re.findall(r'remat_eqn(\d+)\)*/dot_general"', text)]
    assert named and all(eqns[i].primitive.name == "dot_general" for i in named)
    want = jax.tree.leaves(program.lower(program.flat).compile()(*leaves))
    for a, b in zip(want, jax.tree.leaves(compiled(*leaves))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_bias_adds_a_gelus_fusions_recompute_are_never_stored():
    # XLA computes x @ w + b again inside each fusion of gelu's backward pass
    # that reads it; the forward dots' results it stores
    program, _ = _program()
    eqns = program.flat.jaxpr.eqns
    text = program.lower(tag_equations(program.flat)).compile().as_text()
    copied = copied_equations(text, len(eqns))
    dot_results = {id(v) for e in eqns if e.primitive.name == "dot_general"
                   for v in e.outvars}
    bias_adds = [i for i, e in enumerate(eqns) if e.primitive.name == "add"
                 and any(id(v) in dot_results for v in e.invars)]
    assert bias_adds and set(bias_adds) <= copied
    forward_dots = [i for i, e in enumerate(eqns) if id(e.outvars[0]) in dot_results
                    and any(id(e.outvars[0]) in map(id, eqns[a].invars) for a in bias_adds)]
    assert len(forward_dots) == len(bias_adds) and not copied & set(forward_dots)
    assert copied <= set(range(len(eqns)))


def test_a_module_without_fusions_stores_every_tagged_equation():
    hlo = """
ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %a = f32[8]{0} add(%x, %x), metadata={op_name="jit(f)/remat_eqn0/add"}
  ROOT %m = f32[8]{0} multiply(%a, %a), metadata={op_name="jit(f)/remat_eqn1/mul"}
}
"""
    assert copied_equations(hlo, 2) == set()
    assert copied_equations(hlo, 3) == {2}        # folded away: never stored

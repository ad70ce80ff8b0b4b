"""The automatic pass on SPMD programs: per-device sizes, shard_map, collectives.

The multi-device programs run in a subprocess (``sharded_programs.py``) on 8
simulated CPU devices, since ``XLA_FLAGS`` must be set before JAX starts and the
rest of the suite runs on one device. The unit tests of the layout propagation
run here, on abstract shapes.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import doctest
import importlib

from remat._jax.op_model import communicates
from remat._jax.sharding import local_nbytes, per_device_bytes
from remat._jax.to_graph import jaxpr_to_graph

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results():
    """Each program planned at its fraction, by case name (one subprocess)."""
    cases = ["data_parallel::path", "two_dim::path", "fsdp", "shard_map_psum",
             "explicit::path", "in_out_shardings::path", "accumulated:0.8", "flax_layers"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-m", "tests.jax.sharded_programs", *cases],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    assert lines, out.stderr[-3000:]
    return {r["case"]: r for r in lines}


@pytest.mark.parametrize("case,temp_fraction", [
    ("data_parallel", 0.5), ("two_dim", 0.5), ("explicit", 0.5), ("in_out_shardings", 0.5),
    ("fsdp", 0.5), ("shard_map_psum", 0.5), ("accumulated", 0.8), ("flax_layers", 0.5)])
def test_sharded_program_meets_per_device_limit(results, case, temp_fraction):
    r = results[case]
    assert "error" not in r, r.get("error")
    assert r["devices"] == 8
    assert r["met"] and r["planned_total"] <= r["limit"]
    # XLA's per-device temporaries, against the plain program's own.
    assert r["planned_temp"] <= temp_fraction * r["plain_temp"] * 1.02, r
    assert r["max_diff"] <= 1e-5 * r["scale"], r
    assert r["same_shardings"], r


@pytest.mark.parametrize("case", ["data_parallel", "flax_layers"])
def test_regions_keep_their_results_split(results, case):
    # Data parallel: the plan gathers nothing the plain program does not. XLA's
    # partitioner does not carry a region's shardings through its conditional:
    # unannotated, the regions' results were gathered whole on every device.
    assert results[case]["added_gathers"] == 0, results[case]


def test_partitioned_programs_plan_without_the_gate(results):
    # gated, every plan of the sharded MLP read at the plain program's
    # per-device footprint: no column falls back on the gate there
    gated = {case: r.get("gated_columns") for case, r in results.items()}
    assert gated == dict.fromkeys(results, 0), gated


def test_this_process_still_has_one_device():
    assert jax.device_count() == 1


# ------------------------------------------------------------ layout propagation

def _sizes(fun, *shapes, layouts, axes):
    closed = jax.make_jaxpr(fun)(*[jnp.ones(s) for s in shapes])
    return closed.jaxpr, per_device_bytes(closed.jaxpr, layouts, dict(axes))


def test_dot_splits_its_result_by_both_operands():
    jaxpr, sizes = _sizes(lambda x, w: x @ w, (8, 4), (4, 6),
                          layouts=[(("data",), ()), ((), ("model",))],
                          axes={"data": 4, "model": 2})
    (out,) = jaxpr.eqns[0].outvars
    assert sizes[out] == 8 * 6 * 4 // 8


def test_contracted_axis_is_reduced_away():
    jaxpr, sizes = _sizes(lambda x, w: x @ w, (8, 4), (4, 6),
                          layouts=[((), ("model",)), (("model",), ())],
                          axes={"model": 2})
    assert jaxpr.eqns[0].outvars[0] not in sizes     # whole on every device


def test_elementwise_transpose_and_reduction_follow_the_operand():
    jaxpr, sizes = _sizes(lambda x: jnp.sum(jnp.tanh(x).T, axis=1), (8, 6),
                          layouts=[(("data",), ())], axes={"data": 4})
    tanh, transpose, reduce = (e.outvars[0] for e in jaxpr.eqns)
    assert sizes[tanh] == sizes[transpose] == 8 * 6 * 4 // 4
    assert reduce not in sizes      # the split dimension was summed away


def test_broadcast_constant_takes_its_users_layout():
    jaxpr, sizes = _sizes(lambda x: x * jnp.full((8, 6), 2.0), (8, 6),
                          layouts=[(("data",), ())], axes={"data": 4})
    assert all(sizes[e.outvars[0]] == 48 for e in jaxpr.eqns)


def test_uneven_split_rounds_up():
    aval = jax.core.ShapedArray((10, 3), jnp.float32)
    assert local_nbytes(aval, (("a",), ()), {"a": 4}) == 3 * 3 * 4


def test_graph_uses_per_device_sizes_and_scales_flops():
    closed = jax.make_jaxpr(lambda x, w: jnp.tanh(x @ w))(jnp.ones((8, 4)),
                                                          jnp.ones((4, 6)))
    sizes = per_device_bytes(closed.jaxpr, [(("d",), ()), None], {"d": 4})
    whole, split = jaxpr_to_graph(closed), jaxpr_to_graph(closed, value_bytes=sizes)
    assert [v.nbytes for v in split.values] == [32, 96, 48, 48]
    assert split.ops[0].flops == whole.ops[0].flops / 4


def test_a_dot_over_a_split_contracted_axis_does_a_share_of_the_work():
    # x^T @ dh with the batch split over 4 devices: each device sums a quarter of
    # the products into a whole partial result.
    closed = jax.make_jaxpr(lambda x, dh: x.T @ dh)(jnp.ones((32, 4)), jnp.ones((32, 6)))
    sizes = per_device_bytes(closed.jaxpr, [(("d",), ()), (("d",), ())], {"d": 4})
    whole, split = jaxpr_to_graph(closed), jaxpr_to_graph(closed, value_bytes=sizes)
    dot = [k for k, op in enumerate(whole.ops) if op.label.startswith("dot_general")][0]
    assert split.ops[dot].flops == whole.ops[dot].flops / 4


def test_collectives_are_counted_as_communication():
    mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    f = jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh,
                      in_specs=jax.P("i"), out_specs=jax.P())
    closed = jax.make_jaxpr(f)(jnp.ones(4))
    (eqn,) = closed.jaxpr.eqns
    assert communicates(eqn)
    plain = jax.make_jaxpr(jnp.sin)(jnp.ones(4))
    assert not communicates(plain.jaxpr.eqns[0])
    graph = jaxpr_to_graph(closed)
    assert graph.ops[0].flops >= 100 * 16      # the bytes it moves, as FLOPs


@pytest.mark.parametrize("name", ["remat._jax.sharding", "remat._jax.shard_map_split"])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_sharding_annotation_costs_nothing_in_a_program_on_one_device():
    mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = jax.sharding.NamedSharding(mesh, jax.P("i"))
    closed = jax.make_jaxpr(lambda x: jax.lax.with_sharding_constraint(x, spec))(
        jnp.ones(4))
    assert jaxpr_to_graph(closed).ops[0].flops < 100


# ------------------------------------------------------------- region order

def test_regions_are_chained_in_the_plans_order():
    """Each region after the first reads the previous one's ran flag (its last
    result), so the compiler cannot run a region out of the planned order; the
    chained program computes what the plain one does."""
    import remat
    keys = jax.random.split(jax.random.key(1), 7)
    ws = [jax.random.normal(k, (64, 64)) / 8 for k in keys[:-1]]
    x = jax.random.normal(keys[-1], (2048, 64))

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x ** 2)
    grad = jax.grad(loss)
    p = remat.plan(grad, ws, x, memory_limit=0.75)
    regions = [e for e in p.jaxpr.jaxpr.eqns if e.primitive.name == "remat"]
    assert len(regions) >= 2
    for before, after in zip(regions, regions[1:]):
        flag = before.outvars[-1]
        assert flag.aval.shape == () and flag in after.invars
    for got, want in zip(jax.tree.leaves(p.compiled(ws, x)),
                         jax.tree.leaves(jax.jit(grad)(ws, x))):
        assert jnp.max(jnp.abs(got - want)) <= 1e-5 * jnp.max(jnp.abs(want))


# ------------------------------------------------------------- shard_map pieces

def _one_device_shard_map(fun, out_specs):
    mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    return jax.shard_map(fun, mesh=mesh, in_specs=jax.P("i"), out_specs=out_specs)


def test_split_shard_map_computes_the_same():
    from remat._jax.compat import core
    from remat._jax.shard_map_split import split_shard_maps
    f = _one_device_shard_map(
        lambda x: (jax.lax.psum(jnp.sum(jnp.sin(x) * x), "i"), jnp.cos(x) + 1),
        (jax.P(), jax.P("i")))
    x = jnp.linspace(0.0, 1.0, 8)
    closed = jax.make_jaxpr(f)(x)
    split = split_shard_maps(closed)
    assert len(split.jaxpr.eqns) > len(closed.jaxpr.eqns)
    assert all(e.primitive.name == "shard_map" for e in split.jaxpr.eqns)
    for got, want in zip(core.jaxpr_as_fun(split)(x), f(x)):
        assert jnp.allclose(got, want)


def test_varying_scalar_is_never_cut():
    from remat._jax.shard_map_split import split_shard_maps
    f = _one_device_shard_map(lambda x: x * jnp.sum(x), jax.P("i"))
    closed = jax.make_jaxpr(f)(jnp.ones(8))
    split = split_shard_maps(closed)
    for eqn in split.jaxpr.eqns:     # the sum (a scalar varying over i) stays inside
        names = [e.primitive.name for e in eqn.params["jaxpr"].eqns]
        assert "reduce_sum" not in names or "mul" in names

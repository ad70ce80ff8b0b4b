"""bench.bench_heap reads XLA's temp heap from its buffer-assignment dump."""

import doctest
import types

import jax
import jax.numpy as jnp

from bench import bench_heap
from remat._jax.xla_fusion import tag_equations


#: A chain of four tanh layers, batch 256, width 128: each activation is 128 KiB.
W, X = jnp.ones((128, 128)) / 128, jnp.ones((256, 128))


def _chain(w, x):
    for _ in range(4):
        x = jnp.tanh(x @ w)
    return jnp.sum(x)


def test_docstring_examples():
    result = doctest.testmod(bench_heap, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_heap_of_a_compiled_program_matches_memory_analysis():
    lowered = jax.jit(jax.grad(_chain)).lower(W, X)
    heap = bench_heap.heap_of(lowered)
    temp = lowered.compile().memory_analysis().temp_size_in_bytes
    # the forward's activations (128 KiB each) are held for the backward at once
    assert heap.temp_bytes == temp and 4 * 128 * 1024 <= heap.live_bytes <= temp
    assert heap.holes == heap.temp_bytes - heap.live_bytes >= 0


def test_what_xla_holds_at_its_peak_is_named_by_the_primitives_that_defined_it():
    lowered = jax.jit(jax.grad(_chain)).lower(W, X)
    assignment, ranges, hlo = bench_heap.dumped(lowered)
    held = bench_heap.held_at_peak(assignment, ranges, hlo)
    heap = bench_heap.read_heap(assignment, ranges)
    # buffers that share offsets count once in the heap, each in the table
    assert sum(b for _, b in held.values()) >= heap.live_bytes > 0
    # the saved activations (128 KiB each) are tanh's outputs
    assert any(op == "tanh" and size == 128 * 1024 for op, size in held)


def test_buffers_at_xlas_peak_map_back_to_the_values_of_the_graph():
    # Each equation lowered under its own name: XLA's buffers at its peak are the
    # graph's values; on a chain of tanh layers, the saved activations (128 KiB
    # each) are held by XLA and the model alike.
    model = types.SimpleNamespace(params=W, batch=X, loss_fn=_chain)
    planner, _ = bench_heap._planner(model, "path", 0.5)
    program = planner.program
    texts = bench_heap.dumped(program.lower(tag_equations(program.flat)))
    assert "remat_eqn0" in texts[2]
    [row] = bench_heap.grounded_rows("chain", texts, program.graph,
                                     planner.orders[0].timeline)
    both = row.split(" | ")[2]
    assert int(both.split(":")[0]) >= 3        # three saved activations at least

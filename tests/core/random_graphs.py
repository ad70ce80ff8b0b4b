"""Seeded generators of synthetic graphs for the core tests (no JAX)."""

from __future__ import annotations

import random

from remat.core.graph import FUSION_KINDS, Graph, GraphBuilder


def chain(length: int, nbytes: int = 100) -> Graph:
    """x -> op0 -> op1 -> ... -> op{length-1}, every value ``nbytes``."""
    b = GraphBuilder()
    v = b.add_input(nbytes)
    for i in range(length):
        (v,) = b.add_op(f"op{i}", [v], [nbytes])
    return b.build(outputs=[v])


def random_dag(seed: int, num_ops: int = 30, num_inputs: int = 3, max_operands: int = 3,
               fusion: bool = True, window: int | None = None) -> Graph:
    """A random DAG: each op reads 1..max_operands earlier values (inputs or outputs
    of earlier ops, from the last ``window`` ops when given) and defines 1 or 2
    values of random sizes; a few random values are program outputs."""
    rng = random.Random(seed)
    b = GraphBuilder()
    values = [b.add_input(rng.randint(1, 1000), donated=rng.random() < 0.2)
              for _ in range(num_inputs)]
    for i in range(num_ops):
        pool = values if window is None else values[-window:]
        operands = rng.sample(pool, k=min(len(pool), rng.randint(1, max_operands)))
        sizes = [rng.choice([0, 4, 64, 512, 4096, rng.randint(1, 10_000)])
                 for _ in range(rng.choice([1, 1, 1, 2]))]
        kind = rng.choice(FUSION_KINDS) if fusion else "none"
        values.extend(b.add_op(f"op{i}", operands, sizes, fusion=kind,
                               flops=rng.randint(0, 100),
                               working_set_bytes=rng.choice([0, 0, 0, 256])))
    produced = values[num_inputs:]
    outputs = rng.sample(produced, k=min(len(produced), rng.randint(1, 3)))
    return b.build(outputs=outputs)

"""remat demo: an 8-block transformer's gradient step, three ways.

Prints XLA's memory figure, XLA's FLOP count and the median step time for no
remat, ``jax.checkpoint`` and ``remat.checkpoint`` (each block checkpointed), on
whatever device JAX finds. Run from the repository root: ``python -m examples.demo``.
"""

import jax

from bench import models
from bench.bench_checkpoint import compare, table


def main() -> None:
    print(f"jax {jax.__version__} on {jax.default_backend()}: gradient of an 8-block "
          "transformer (batch 8, seq 256, width 256, 4 heads)\n")
    rows = compare(models.transformer, rounds=5)
    print(table({"8-block transformer": rows}))
    none, ours = rows[0], rows[-1]
    print(f"\nremat.checkpoint needs {ours['temp'] / none['temp']:.2f}x the temporary "
          f"memory of no remat, at {ours['time'] / none['time']:.2f}x its step time; "
          f"jax.checkpoint needs {rows[1]['temp'] / none['temp']:.2f}x.")


if __name__ == "__main__":
    main()

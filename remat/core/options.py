"""The one options record of the automatic pass, and size parsing.

Every knob, with its unit in its name. Built from keyword arguments of
``remat.jit``/``remat.plan`` or from the ``REMAT_FLAGS`` environment variable.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["RematOptions", "ALGORITHMS", "parse_bytes", "DEFAULT_SMALL_NODE_BYTES"]

#: The automatic rematerialization algorithms, by name.
ALGORITHMS = ("standard", "path", "compress", "standardcompress", "optimal")

#: Values smaller than this are never rematerialized, as in the seed's pass.
DEFAULT_SMALL_NODE_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class RematOptions:
    """Settings of one planning run.

    Attributes:
      memory_limit_bytes: the footprint to stay within (arguments + outputs +
        temporaries, as XLA's ``memory_analysis()`` counts them).
      algorithm: one of :data:`ALGORITHMS`.
      scheduler: the scheduler that orders the program before planning
        (``"postorder"``, ``"dfs"``, ``"list"`` or ``"best"``).
      small_node_bytes: values smaller than this are never recomputed.
      max_chain_ops: the most ops one recomputation may chain back through (the
        greedy algorithms start at 1 and grow it when stuck, as XLA's pass grows
        its block size).
      solver_seconds: the time limit of ``"optimal"``'s integer program; when it
        stops the solver, the best plan found is returned with its proven gap.
      verbose: ``"optimal"`` logs each phase and shows the solver's own log.
    """

    memory_limit_bytes: int
    algorithm: str = "path"
    scheduler: str = "best"
    small_node_bytes: int = DEFAULT_SMALL_NODE_BYTES
    max_chain_ops: int = 64
    solver_seconds: float = 60.0
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose one of "
                             f"{ALGORITHMS}.")
        if self.solver_seconds <= 0:
            raise ValueError(f"solver_seconds must be > 0, got {self.solver_seconds}.")
        if self.memory_limit_bytes < 0 or self.small_node_bytes < 0:
            raise ValueError("memory_limit_bytes and small_node_bytes must be >= 0.")


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
          "g": 10**9, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40, "tb": 10**12}


def parse_bytes(text: str | int) -> int:
    """Bytes from an int or a string such as ``"512MiB"``, ``"2GiB"``, ``"1e6"``.

    >>> parse_bytes("512MiB"), parse_bytes("1.5 kB"), parse_bytes(64)
    (536870912, 1500, 64)
    """
    if isinstance(text, bool):
        raise TypeError("a size must be an int or a string like '512MiB', not a bool.")
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*",
                         str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size; write bytes as an int or a "
                         "string like '512MiB', '2GiB', '300MB'.")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])

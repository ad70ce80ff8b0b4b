"""``REMAT_FLAGS``: settings of the automatic pass from the environment.

Read when ``remat.jit``/``remat.plan`` get no explicit setting, as XLA reads
``XLA_FLAGS``. Space-separated, e.g.::

  REMAT_FLAGS="--memory_limit=2GiB --algorithm=standard --dump_to=/tmp/remat --dump_dot"

Flags: ``--memory_limit=`` (bytes, a size such as ``512MiB``, or a fraction in
(0, 1]), ``--algorithm=``, ``--scheduler=``, ``--small_node_limit=`` (a size),
``--dump_to=DIR``, ``--dump_dot`` (DOT before and after), ``--dump_memlog``
(the memory log with the decisions), ``--solver_seconds=`` (the time limit of
``--algorithm=optimal``). An unknown flag is an error.
"""

from __future__ import annotations

import os
import shlex

__all__ = ["parse_flags", "flags_from_env", "ENV_VAR"]

ENV_VAR = "REMAT_FLAGS"
_VALUED = {"memory_limit", "algorithm", "scheduler", "small_node_limit", "dump_to",
           "solver_seconds"}
_SWITCHES = {"dump_dot", "dump_memlog"}


def parse_flags(text: str) -> dict[str, str | bool]:
    """``"--algorithm=path --dump_dot"`` -> ``{"algorithm": "path", "dump_dot": True}``.

    >>> parse_flags("--memory_limit=1GiB --dump_memlog")
    {'memory_limit': '1GiB', 'dump_memlog': True}
    """
    flags: dict[str, str | bool] = {}
    for word in shlex.split(text):
        if not word.startswith("--"):
            raise ValueError(f"{ENV_VAR}: {word!r} is not a flag; flags look like "
                             "--name=value or --name.")
        name, eq, value = word[2:].partition("=")
        if name in _VALUED and eq and value:
            flags[name] = value
        elif name in _SWITCHES and not eq:
            flags[name] = True
        elif name in _SWITCHES and value.lower() in ("true", "false", "1", "0"):
            flags[name] = value.lower() in ("true", "1")
        elif name in _VALUED:
            raise ValueError(f"{ENV_VAR}: --{name} needs a value (--{name}=...).")
        else:
            known = sorted(f"--{n}=" for n in _VALUED) + sorted(f"--{n}" for n in _SWITCHES)
            raise ValueError(f"{ENV_VAR}: unknown flag --{name}; known flags: "
                             f"{', '.join(known)}.")
    return flags


def flags_from_env() -> dict[str, str | bool]:
    """The parsed ``REMAT_FLAGS`` of the current environment (empty if unset)."""
    return parse_flags(os.environ.get(ENV_VAR, ""))

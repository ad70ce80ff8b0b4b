"""The one options record of the automatic pass, and the parsing of its inputs.

Every setting of ``remat.jit``/``remat.plan`` lives in :class:`RematOptions`:
keyword arguments, ``REMAT_FLAGS`` and the defaults all go through
:func:`resolve_options`, which names the user's parameter in every error. Two
kinds of bytes never share a field: ``memory_limit`` is in XLA's terms (what
``compile().memory_analysis()`` reports), ``model_target_bytes`` in the planner's
model (what the simulator of ``remat.core`` counts).

>>> o = resolve_options({"memory_limit": "2GiB", "algorithm": "path"}, {})
>>> o.memory_limit, o.algorithm, o.scheduler, o.small_node_given
(2147483648, 'path', 'best', False)
>>> resolve_options({"memory_limit": 0.5}, {"small_node_limit": "0"}).small_node_bytes
0
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["RematOptions", "ALGORITHMS", "PORTFOLIO", "SCHEDULERS", "parse_bytes",
           "parse_limit", "resolve_options", "DEFAULT_SMALL_NODE_BYTES"]

#: The automatic rematerialization algorithms, by name.
ALGORITHMS = ("standard", "path", "compress", "standardcompress", "optimal", "segments")
#: The default of the automatic pass: several algorithms, the cheapest plan that
#: XLA reads within the limit (``remat.core.search``).
PORTFOLIO = "auto"
#: The schedulers, by name (``remat.core.schedulers``).
SCHEDULERS = ("best", "list", "dfs", "postorder")

#: Values smaller than this are never rematerialized, as in the seed's pass.
DEFAULT_SMALL_NODE_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class RematOptions:
    """Settings of the automatic pass and of one planning run.

    Attributes:
      model_target_bytes: the peak, in the planner's model, that an algorithm
        plans for (set by the search for each plan it asks for).
      algorithm: one of :data:`ALGORITHMS`, or :data:`PORTFOLIO` (several).
      scheduler: the scheduler that orders the program before planning
        (one of :data:`SCHEDULERS`).
      small_node_bytes: values smaller than this are never recomputed.
      max_chain_ops: the most ops one recomputation may chain back through (the
        greedy algorithms start at 1 and grow it when stuck, as XLA's pass grows
        its block size).
      solver_seconds: the time limit of ``"optimal"``'s integer program; when it
        stops the solver, the best plan found is returned with its proven gap.
      verbose: ``"optimal"`` logs each phase and shows the solver's own log.
      memory_limit: the user's limit in XLA's terms: bytes (an int), or a
        fraction (a float in (0, 1]) of the plain program's temporaries.
      small_node_given: whether ``small_node_bytes`` was set by the user; if not,
        the pass lowers it where the values it keeps block a target, and the
        heuristics also plan with none, the cheaper plan kept.
      dump_to, dump_dot, dump_memlog: where to write the plan, and what else.
    """

    model_target_bytes: int = 0
    algorithm: str = PORTFOLIO
    scheduler: str = "best"
    small_node_bytes: int = DEFAULT_SMALL_NODE_BYTES
    max_chain_ops: int = 64
    solver_seconds: float = 60.0
    verbose: bool = False
    memory_limit: int | float | None = None
    small_node_given: bool = False
    dump_to: str | None = None
    dump_dot: bool = False
    dump_memlog: bool = False

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS + (PORTFOLIO,):
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose one of "
                             f"{', '.join(map(repr, (PORTFOLIO,) + ALGORITHMS))}.")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {self.scheduler!r}; choose one of "
                             f"{', '.join(map(repr, SCHEDULERS))}.")
        if not self.solver_seconds > 0:
            raise ValueError(f"solver_seconds must be > 0, got {self.solver_seconds}.")
        if self.model_target_bytes < 0 or self.small_node_bytes < 0:
            raise ValueError("model_target_bytes and small_node_bytes must be >= 0.")


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


_LIMIT_FORMS = ("accepted: bytes as an int > 0, a size string such as '512MiB' or "
                "'2GiB', or a fraction in (0, 1] (a float, or a string such as '0.5') "
                "of the plain program's temporaries")


def parse_limit(limit: Any) -> int | float:
    """The ``memory_limit`` as bytes (an int > 0) or a fraction (a float in (0, 1]).

    >>> parse_limit("0.5"), parse_limit("1GiB"), parse_limit(4096), parse_limit(1.0)
    (0.5, 1073741824, 4096, 1.0)
    """
    bad = ValueError(f"remat: memory_limit={limit!r} is not a memory limit; "
                     f"{_LIMIT_FORMS}.")
    if isinstance(limit, bool) or not isinstance(limit, (numbers.Real, str)):
        raise bad
    if isinstance(limit, numbers.Integral):
        limit = int(limit)
    elif isinstance(limit, numbers.Real):
        limit = float(limit)
    if isinstance(limit, str):
        try:
            value = float(limit)
        except ValueError:
            try:
                limit = parse_bytes(limit)
            except ValueError:
                raise bad from None
        else:
            # "0.5": a fraction; "4096" or "1e6": bytes
            limit = value if "." in limit or not value.is_integer() else int(value)
    if isinstance(limit, float):
        if not (math.isfinite(limit) and 0 < limit <= 1):
            raise bad
        return limit
    if limit <= 0:
        raise bad
    return limit


def _small_node_bytes(value: Any) -> int:
    try:
        small = parse_bytes(value)
    except (TypeError, ValueError):
        small = -1
    if small < 0:
        raise ValueError(f"remat: small_node_limit={value!r} is not a size; accepted: "
                         "bytes as an int >= 0 or a size string such as '1MiB' (0: "
                         "any value may be recomputed).")
    return small


def resolve_options(given: Mapping[str, Any], flags: Mapping[str, Any]) -> RematOptions:
    """The options of one ``remat.jit``/``remat.plan``: ``given`` (the keyword
    arguments that were passed) wins over ``flags`` (parsed ``REMAT_FLAGS``), which
    wins over the defaults. Errors name the parameter, the value and what is
    accepted."""
    def pick(key, default=None):
        return given[key] if key in given else flags.get(key, default)

    limit = pick("memory_limit")
    if limit is None:
        raise ValueError("remat: no memory limit; pass memory_limit= (bytes, a size "
                         "such as '2GiB', or a fraction in (0, 1] of the plain "
                         "program's temporaries) or set REMAT_FLAGS=--memory_limit=...")
    algorithm, scheduler = pick("algorithm", PORTFOLIO), pick("scheduler", "best")
    names = (PORTFOLIO,) + ALGORITHMS
    if algorithm not in names:
        raise ValueError(f"remat: algorithm={algorithm!r} is unknown; accepted: "
                         f"{', '.join(map(repr, names))}.")
    if scheduler not in SCHEDULERS:
        raise ValueError(f"remat: scheduler={scheduler!r} is unknown; accepted: "
                         f"{', '.join(map(repr, SCHEDULERS))}.")
    try:
        seconds = float(pick("solver_seconds", 60.0))
    except ValueError:
        seconds = math.nan
    if not seconds > 0:
        raise ValueError(f"remat: solver_seconds={pick('solver_seconds')!r} is not a "
                         "time limit; accepted: seconds > 0.")
    dump_to = pick("dump_to")
    chosen = {k for k in ("dump_dot", "dump_memlog") if flags.get(k)}
    if chosen and not dump_to:
        raise ValueError(f"REMAT_FLAGS: --{' --'.join(sorted(chosen))} needs a directory: "
                         "add --dump_to=DIR (or pass dump_to=).")
    return RematOptions(
        algorithm=algorithm, scheduler=scheduler,
        small_node_bytes=_small_node_bytes(pick("small_node_limit",
                                                DEFAULT_SMALL_NODE_BYTES)),
        solver_seconds=seconds, memory_limit=parse_limit(limit),
        small_node_given="small_node_limit" in given or "small_node_limit" in flags,
        dump_to=dump_to, dump_dot=not chosen or "dump_dot" in chosen,
        dump_memlog=not chosen or "dump_memlog" in chosen)

"""``remat.pareto``: memory against time for several algorithms and limits.

For each algorithm and each memory limit, :func:`remat.plan` rewrites and compiles
the program; the row records XLA's own figures (compiled footprint, FLOPs from
``cost_analysis()``) and the measured median step time, the variants (plain
program included) timed in turn so that machine noise hits them alike.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from remat._jax.auto import MemoryLimitError, jit
from remat._jax.xla_figures import XlaFootprint

_MIB = 2 ** 20


@dataclasses.dataclass(frozen=True)
class ParetoRow:
    """One algorithm at one limit (``algorithm="none"``: the plain program).

    Attributes:
      algorithm: the algorithm's name.
      limit: the limit as given (a fraction or bytes); None for the plain program.
      limit_bytes: the limit in bytes (0 for the plain program).
      footprint_bytes: XLA's compiled footprint (None if the limit was refused).
      flops: XLA's FLOPs of the compiled program (None if refused).
      step_seconds: the median measured step time (None if refused).
      extra_flops: ``flops`` minus the plain program's (None if refused).
      plan_seconds: planning time (0 for the plain program).
      error: why the limit was refused, if it was.
      status: for ``"optimal"``, the result's status (e.g. ``"heuristic_search"``:
        the plan is a heuristic's, see :class:`remat.core.algorithms.PlanResult`).
    """
    algorithm: str
    limit: Any
    limit_bytes: int
    footprint_bytes: int | None
    flops: float | None
    step_seconds: float | None
    extra_flops: float | None = None
    plan_seconds: float = 0.0
    error: str = ""
    status: str = ""

    def __str__(self) -> str:
        limit = ("plain program" if self.limit is None else f"limit {self.limit:.0%}"
                 if isinstance(self.limit, float) else f"limit {self.limit}")
        if self.error:
            return f"ParetoRow({self.algorithm}, {limit}: refused)"
        time = "" if self.step_seconds is None else f", step {self.step_seconds:.4f} s"
        return (f"ParetoRow({self.algorithm}, {limit}: XLA footprint "
                f"{self.footprint_bytes / _MIB:.1f} MiB, {self.flops / 1e9:.2f} GFLOP{time})")

    __repr__ = __str__


@dataclasses.dataclass(frozen=True)
class Pareto:
    """The rows of :func:`pareto`, with a markdown table and a plot."""
    rows: tuple[ParetoRow, ...]

    def to_markdown(self) -> str:
        """One line per row: footprint, FLOPs and time, each also as a ratio to the
        plain program."""
        plain = self.rows[0]
        lines = ["| algorithm | limit | limit (MiB) | XLA footprint (MiB) | GFLOPs | "
                 "extra GFLOPs | FLOPs ratio | median step (s) | time ratio |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in self.rows:
            limit = ("-" if r.limit is None else f"{r.limit:.0%}"
                     if isinstance(r.limit, float) else str(r.limit))
            if r.error:
                lines.append(f"| {r.algorithm} | {limit} | {r.limit_bytes / _MIB:.1f} | "
                             f"refused | | | | | |")
                continue
            lines.append(
                f"| {r.algorithm} | {limit} | {r.limit_bytes / _MIB:.1f} | "
                f"{r.footprint_bytes / _MIB:.1f} | {r.flops / 1e9:.2f} | "
                f"{r.extra_flops / 1e9:.2f} | {r.flops / plain.flops:.2f} | "
                f"{r.step_seconds:.4f} | {r.step_seconds / plain.step_seconds:.2f} |")
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.to_markdown()

    def __repr__(self) -> str:
        return f"Pareto({len(self.rows)} rows: {', '.join(map(str, self.rows))})"

    def plot(self, path: str | os.PathLike, title: str = "") -> None:
        """A PNG of step time against XLA footprint, one line per algorithm."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for algorithm in dict.fromkeys(r.algorithm for r in self.rows):
            pts = sorted((r.footprint_bytes / _MIB, r.step_seconds) for r in self.rows
                         if r.algorithm == algorithm and not r.error)
            if pts:
                ax.plot(*zip(*pts), "o" if algorithm == "none" else "o-", label=algorithm)
        ax.set_xlabel("XLA footprint (MiB)")
        ax.set_ylabel("median step time (s)")
        ax.set_title(title or "memory vs time")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


def pareto(fun: Callable, *args: Any, limits: Sequence[Any] = (0.75, 0.5, 0.3),
           algorithms: Sequence[str] = ("path", "standard", "optimal"),
           rounds: int = 5, **kwargs: Any) -> Pareto:
    """Plans ``fun(*args)`` with each algorithm at each limit and measures it.

    Arguments:
      fun, args: the program and its (positional) arguments.
      limits: memory limits as :func:`remat.jit` takes them (fractions of the
        plain program's temporaries, bytes, or sizes such as ``"64MiB"``).
      algorithms: algorithm names.
      rounds: timed steps per variant (median reported).
      **kwargs: passed to :func:`remat.jit` (e.g. ``small_node_limit``).

    Returns:
      a :class:`Pareto`; its first row is the plain program (``"none"``).
      A refused limit gives a row with ``error`` set.

    >>> import jax, jax.numpy as jnp, remat
    >>> def loss(ws, x):
    ...   for w in ws:
    ...     x = jnp.tanh(x @ w)
    ...   return jnp.sum(x ** 2)
    >>> p = remat.pareto(jax.grad(loss), [jnp.eye(64)] * 4, jnp.ones((256, 64)),
    ...                  limits=(0.6,), algorithms=("path",), rounds=1,
    ...                  small_node_limit=0)
    >>> [r.algorithm for r in p.rows]
    ['none', 'path']
    """
    plain = jax.jit(fun).lower(*args).compile()
    plain_flops = float(plain.cost_analysis()["flops"])
    plain_fp = XlaFootprint.of(plain).total
    variants: list[tuple[ParetoRow, Any]] = [
        (ParetoRow("none", None, 0, plain_fp, plain_flops, None, 0.0), plain)]
    for algorithm in algorithms:
        for limit in limits:
            step = jit(fun, memory_limit=limit, algorithm=algorithm, **kwargs)
            try:
                p = step.plan_for(*args)
            except MemoryLimitError as e:
                variants.append((ParetoRow(algorithm, limit, 0, None, None, None,
                                           error=str(e)), None))
                continue
            flops = float(p.compiled.cost_analysis()["flops"])
            variants.append((ParetoRow(algorithm, limit, p.limit_bytes, p.planned.total,
                                       flops, None, flops - plain_flops, p.plan_seconds,
                                       status=getattr(p.result, "status", "")), step))
    times: list[list[float]] = [[] for _ in variants]
    for _ in range(rounds):
        for k, (_, run) in enumerate(variants):
            if run is None:
                continue
            start = time.perf_counter()
            jax.block_until_ready(run(*args))
            times[k].append(time.perf_counter() - start)
    rows = [dataclasses.replace(row, step_seconds=float(np.median(t)) if t else None)
            for (row, _), t in zip(variants, times)]
    return Pareto(tuple(rows))

"""What the automatic pass returns: :class:`Plan`, and :class:`MemoryLimitError`
when no plan is within the limit."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from remat._jax.call import CallSpec, CallSplit, OutputTree
from remat._jax.compat import core
from remat._jax.xla_figures import XlaFootprint
from remat.core.algorithms import PlanResult
from remat.core.dot import to_dot
from remat.core.graph import Graph
from remat.core.memlog import format_bytes, memlog

__all__ = ["MemoryLimitError", "Plan"]


class MemoryLimitError(ValueError):
    """The memory limit cannot be met by rematerialization.

    Attributes:
      limit_bytes: the limit asked for.
      least_bytes: the least footprint reached (a limit of this or more is met);
        None if the limit was refused by ``bound_bytes`` alone.
      bound_bytes: no program with these arguments and outputs goes below this.
    """

    def __init__(self, message: str, limit_bytes: int = 0,
                 least_bytes: int | None = None, bound_bytes: int = 0):
        super().__init__(message)
        self.limit_bytes, self.least_bytes = limit_bytes, least_bytes
        self.bound_bytes = bound_bytes


class _CompiledCall:
    """A compiled plan, called like the user's function (static and non-array
    arguments are left out before the call); XLA's ``Compiled`` methods
    (``cost_analysis``, ``memory_analysis``, ``as_text``) are its own."""

    def __init__(self, compiled, spec: CallSpec, out_tree: OutputTree):
        self._compiled, self._spec, self._out = compiled, spec, out_tree

    def __call__(self, *args, **kwargs):
        return self._out.restore(
            self._compiled(*CallSplit.of(args, kwargs, self._spec).dynamic))

    def __getattr__(self, name):
        return getattr(self._compiled, name)


@dataclasses.dataclass(frozen=True, repr=False)
class Plan:
    """What the automatic pass decided for one program, and what XLA made of it.

    Attributes:
      limit_bytes: the footprint asked for (XLA bytes).
      baseline: XLA's footprint of the program as written, as its measuring
        compile reads it (``program.MEASURE_OPTIONS``: on CPU it may differ from
        a full compile's by a few hundred bytes); fractional limits are of it.
      planned: XLA's footprint of the rewritten program (its full compile).
      result: the planning result (graph level: regions, simulations).
      graph: the planning graph of the program as written.
      jaxpr: the rewritten program (a function of the call's array leaves).
      plan_seconds: time spent planning and rewriting for this call (not tracing,
        which ``jax.jit`` does too, nor compiling).
      out_tree: the structure of the function's results (a
        :class:`~remat._jax.call.OutputTree`: the compiled program returns
        its traced leaves, the others are put back).
      compiled: the compiled rewritten program, called like the function.
      small_node_bytes: the small-node limit its plan was made with (the default
        is lowered where the values it keeps would put a target out of reach).
      algorithm: the algorithm (and order) that planned it; ``"plain"``: nothing
        needed recomputing; ``"as written"``: the program with the user's own
        checkpoints, as traced (see ``own_flops``).
      compile_seconds: time spent in XLA's compiles for this call (the plain
        program's included on a program's first call).
      compiles: programs compiled to measure for this call (plans, and the plain
        program reading late; cached ones not counted).
      own_flops: FLOPs the user's own checkpoint regions recompute, where the
        answer is the program as written (``algorithm == "as written"``).
    """
    limit_bytes: int
    baseline: XlaFootprint
    planned: XlaFootprint
    result: PlanResult
    graph: Graph
    jaxpr: core.ClosedJaxpr
    plan_seconds: float
    out_tree: Any = dataclasses.field(repr=False, default=None)
    compiled: Any = dataclasses.field(repr=False, default=None)
    small_node_bytes: int = 0
    algorithm: str = ""
    compile_seconds: float = 0.0
    compiles: int = 0
    own_flops: float = 0.0

    @property
    def met(self) -> bool:
        return self.planned.total <= self.limit_bytes

    @property
    def extra_flops(self) -> float:
        """FLOPs of the recomputations (our estimate)."""
        return self.result.extra_flops + self.own_flops

    @property
    def recomputed(self) -> list[str]:
        """One line per recomputed op: its label and source line."""
        g = self.graph
        return [f"{g.ops[o].label} from {g.ops[o].source or 'unknown source'}"
                for r in self.result.regions for o in r.recompute]

    def memlog(self) -> str:
        """The memory log of the rewritten program, with the remat decisions."""
        rw = self.result.rewritten
        decisions = {o: ("recompute" if rw.is_copy[o] else
                         f"region {rw.region[o]}" if rw.region[o] >= 0 else "")
                     for o in range(len(rw.origin))}
        return memlog(rw.graph, self.result.timeline, decisions)

    def to_dot(self, after: bool = True) -> str:
        """DOT of the program after (default) or before the rewrite; recomputed ops
        are highlighted."""
        rw = self.result.rewritten
        if not after:
            return to_dot(self.graph, self.result.baseline)
        return to_dot(rw.graph, self.result.timeline,
                      frozenset(o for o, c in enumerate(rw.is_copy) if c))

    def plot(self, path: str | os.PathLike) -> None:
        """A PNG of live bytes per step, before and after, with the limit."""
        from remat.core.plot import plot_timeline   # matplotlib is imported lazily
        rw = self.result.rewritten
        plot_timeline(rw.graph, self.result.timeline, path,
                      title="after rematerialization", limit_bytes=self.limit_bytes,
                      recomputed=frozenset(o for o, c in enumerate(rw.is_copy) if c))

    def __repr__(self) -> str:
        return str(self)

    def _planned_by(self) -> str:
        return self.algorithm

    def __str__(self) -> str:
        return (f"remat plan: limit {format_bytes(self.limit_bytes)}, XLA footprint "
                f"{format_bytes(self.baseline.total)} -> {format_bytes(self.planned.total)}"
                f" ({'met' if self.met else 'NOT met'}) by {self._planned_by()}, "
                f"{len(self.result.regions)} region(s), {len(self.recomputed)} "
                f"recomputed op(s), +{self.extra_flops / 1e9:.2f} GFLOP, planned in "
                f"{self.plan_seconds:.2f} s")

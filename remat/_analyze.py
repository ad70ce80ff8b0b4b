"""``remat.analyze``: predict a function's memory footprint without compiling it."""

from __future__ import annotations

import dataclasses
import os
from typing import AbstractSet, Any, Callable, Mapping

import jax

from ._jax.to_graph import jaxpr_to_graph
from .core.dot import to_dot
from .core.gc_pause import gc_paused
from .core.graph import Graph
from .core.memlog import format_bytes, memlog
from .core.plot import plot_timeline
from .core.schedulers import get_scheduler
from .core.schedulers.best import best_schedule_and_timeline
from .core.simulate import Timeline, simulate

__all__ = ["analyze", "MemoryReport"]


@dataclasses.dataclass(frozen=True, repr=False)
class MemoryReport:
    """The predicted memory of one program (see ``remat.core.simulate`` for the model).

    ``str()`` and ``repr()`` give a one-line summary (the peak and its parts, the op
    at the peak); ``memlog()`` gives every step.

    Attributes:
      graph: the program graph (``remat.core.graph.Graph``).
      timeline: the simulated memory at each step of the schedule.
      scheduler: the name of the scheduler that ordered the ops.
    """

    graph: Graph
    timeline: Timeline
    scheduler: str

    @property
    def peak_bytes(self) -> int:
        """Predicted footprint: arguments + outputs + temporaries at the peak, the
        figure XLA reports as ``argument + output + temp - alias`` bytes."""
        return self.timeline.peak_bytes

    @property
    def argument_bytes(self) -> int:
        """Bytes of the program's arguments (and closed-over constants)."""
        return self.timeline.input_bytes

    @property
    def output_bytes(self) -> int:
        """Bytes of the program's results."""
        return self.timeline.output_bytes

    @property
    def temp_bytes(self) -> int:
        """Bytes of temporaries live at the peak."""
        return self.peak_bytes - self.argument_bytes - self.output_bytes

    @property
    def peak_op(self) -> str:
        """The op running at the peak, with its source line (``""`` without ops)."""
        if self.timeline.peak_step < 0:
            return ""
        op = self.graph.ops[self.timeline.schedule[self.timeline.peak_step]]
        return f"{op.label} at {op.source or 'unknown source'}"

    def memlog(self, decisions: Mapping[int, str] | None = None) -> str:
        """The memory log, one line per op (``remat.core.memlog.memlog``)."""
        return memlog(self.graph, self.timeline, decisions)

    def to_dot(self, recomputed: AbstractSet[int] = frozenset()) -> str:
        """DOT text of the program, peak marked (``remat.core.dot.to_dot``)."""
        return to_dot(self.graph, self.timeline, recomputed)

    def plot(self, path: str | os.PathLike, *, limit_bytes: int | None = None) -> None:
        """Writes a PNG memory timeline to ``path`` (needs matplotlib)."""
        plot_timeline(self.graph, self.timeline, path, limit_bytes=limit_bytes,
                      title=f"predicted memory, peak {format_bytes(self.peak_bytes)}")

    def __str__(self) -> str:
        return (f"MemoryReport(peak {format_bytes(self.peak_bytes)} = arguments "
                f"{format_bytes(self.argument_bytes)} + outputs "
                f"{format_bytes(self.output_bytes)} + temporaries "
                f"{format_bytes(self.temp_bytes)}; {len(self.graph.ops)} ops, "
                f"scheduler {self.scheduler!r}, peak at {self.peak_op or '-'})")

    __repr__ = __str__


def analyze(fun: Callable[..., Any], *args: Any, scheduler: str = "best",
            **kwargs: Any) -> MemoryReport:
    """Predicts the memory XLA will need to run ``fun(*args, **kwargs)``.

    Traces ``fun`` with ``jax.make_jaxpr`` (nothing is compiled or run), converts the
    whole program into a graph (``remat._jax.to_graph``; on the CPU backend, 16-bit
    matmuls are modelled as the f32 computations XLA:CPU runs), orders it with
    ``scheduler`` and simulates the bytes live at each step, with the simulator's
    closest model of XLA (repeated equations merged as CSE does, but not a
    ``remat.checkpoint`` region's recomputation, which its lowering keeps apart and
    runs once the cotangents exist; temporaries allowed in result buffers not yet
    written).

    Arguments:
      fun: the function, typically a whole training step such as
        ``jax.value_and_grad(loss)``.
      *args: its arguments (arrays or ``jax.ShapeDtypeStruct``s).
      scheduler: ``"best"`` (default), ``"list"``, ``"dfs"`` or ``"postorder"``.
      **kwargs: keyword arguments for ``fun``.

    Returns:
      a :class:`MemoryReport`; ``.peak_bytes`` is the predicted footprint.

    Example::

        >>> import jax, jax.numpy as jnp, remat
        >>> report = remat.analyze(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w))),
        ...                        jnp.ones((64, 64)), jnp.ones((32, 64)))
        >>> report.peak_bytes >= 2 * 64 * 64 * 4
        True
    """
    schedule_fn = get_scheduler(scheduler)
    closed_jaxpr = jax.make_jaxpr(fun)(*args, **kwargs)
    with gc_paused():
        graph = jaxpr_to_graph(closed_jaxpr, merge_repeated=True,
                               upcast_half_precision_matmuls=jax.default_backend() == "cpu")
        if scheduler == "best":
            _, timeline = best_schedule_and_timeline(graph, reuse_result_buffers=True)
        else:
            timeline = simulate(graph, schedule_fn(graph), check=False,
                                reuse_result_buffers=True)
    return MemoryReport(graph, timeline, scheduler)

"""Measuring compiles: started on worker threads, each read once.

XLA compiles without holding Python's lock, and a measuring compile on CPU keeps
one core busy (``program.MEASURE_OPTIONS``). So a compile can run beside the
search: the plain program's while the orders of its ops are simulated, and on CPU
with a second core the plan the search may ask for next beside the one it waits
for (:meth:`remat.core.search.Frontier.point`'s ``ahead``).

Rule: running ahead changes no answer. A compile started ahead is read only when
the search asks for that plan, as it would have compiled it then; one it never
asks for is dropped (its work lost, its figures never seen).

>>> pending = Pending()
>>> pending.start("plan", lambda: 6 * 7)
>>> pending.started("plan"), pending.take("plan"), pending.started("plan")
(True, 42, False)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
from collections.abc import Callable, Hashable
from typing import Any

from remat._jax.compat import core
from remat._jax.program import Program
from remat._jax.xla_figures import XlaFootprint
from remat.core.algorithms import PlanResult

__all__ = ["WORKERS", "Pending", "Measured", "Measuring", "cores"]

#: Compiles at once: the one the search waits for and one ahead of it.
WORKERS = 2

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def cores() -> int:
    """The CPU cores this process may run on (a compile run ahead of the search
    on a single core would only slow the one it waits for)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # (not on every OS)
        return os.cpu_count() or 1


def _workers() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=WORKERS, thread_name_prefix="remat-compile")
        return _pool


class Pending:
    """Compiles started and not read yet, by key."""

    def __init__(self):
        self._futures: dict[Hashable, concurrent.futures.Future] = {}

    def start(self, key: Hashable, compile_fn: Callable[[], Any]) -> None:
        """Starts ``compile_fn()`` on a worker, unless ``key``'s is started."""
        if key not in self._futures:
            self._futures[key] = _workers().submit(compile_fn)

    def started(self, key: Hashable) -> bool:
        """Whether ``key``'s compile is started and not read yet."""
        return key in self._futures

    def take(self, key: Hashable) -> Any:
        """``key``'s result (waiting for it; its error, raised here), forgotten."""
        return self._futures.pop(key).result()

    def drop(self) -> None:
        """Forgets every compile not read (those not begun are cancelled)."""
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()


@dataclasses.dataclass(frozen=True)
class Measured:
    """What a :class:`~remat.core.search.Point` keeps of a compiled plan: with
    ``final``, the program compiled to run; else the lowered program, to compile
    to run should the plan answer (a measuring compile's code is not kept)."""
    result: PlanResult
    jaxpr: core.ClosedJaxpr
    compiled: Any
    footprint: XlaFootprint
    small_node_bytes: int
    final: bool = True
    lowered: Any = None

    @classmethod
    def of(cls, program: Program, result: PlanResult, jaxpr: core.ClosedJaxpr,
           small_node_bytes: int, lowered: Any = None, compiled: Any = None,
           footprint: XlaFootprint | None = None) -> "Measured":
        """``jaxpr`` compiled to measure (and to run, where that is the same);
        ``lowered``, ``compiled`` and ``footprint``, where given, are its
        lowering, that compile and its figures."""
        if compiled is None:
            lowered = program.lower(jaxpr)
            compiled = program.compile_lowered(lowered, measure_only=True)
        final = not program.measures_in_part
        return cls(result, jaxpr, compiled if final else None,
                   footprint or XlaFootprint.of(compiled),
                   small_node_bytes, final, None if final else lowered)


def _with_figures(compiled: Any) -> tuple[Any, XlaFootprint]:
    """A compile and its figures, read on the worker (reading them takes tens of
    milliseconds on a big program)."""
    return compiled, XlaFootprint.of(compiled)


class Measuring:
    """The measuring compiles of one program started and not read yet, by key."""

    def __init__(self, program: Program):
        self.program = program
        self._pending = Pending()
        self._lowered: dict[Hashable, tuple[core.ClosedJaxpr, Any]] = {}

    def start(self, key: Hashable, jaxpr: core.ClosedJaxpr) -> None:
        """Lowers ``jaxpr`` (here: lowering holds Python's lock) and starts its
        measuring compile on a worker, unless ``key``'s is started."""
        if key in self._lowered:
            return
        lowered = self.program.lower(jaxpr)
        self._lowered[key] = (jaxpr, lowered)
        self._pending.start(key, lambda: _with_figures(self.program.compile_lowered(
            lowered, measure_only=True)))

    def started(self, key: Hashable) -> bool:
        """Whether ``key``'s compile is started and not read yet."""
        return key in self._lowered

    def take(self, key: Hashable) -> tuple[Any, Any, XlaFootprint]:
        """``key``'s lowering, measuring compile and its figures (waiting for
        them), forgotten."""
        _, lowered = self._lowered.pop(key)
        return (lowered, *self._pending.take(key))

    def measured(self, key: Hashable, result: PlanResult,
                 jaxpr: core.ClosedJaxpr | None, small_node_bytes: int) -> Measured:
        """The :class:`Measured` of ``key``'s compile if started, else of
        ``jaxpr`` compiled now."""
        if key not in self._lowered:
            return Measured.of(self.program, result, jaxpr, small_node_bytes)
        jaxpr = self._lowered[key][0]
        return Measured.of(self.program, result, jaxpr, small_node_bytes, *self.take(key))

    def drop(self) -> None:
        """Forgets every compile not read (those not begun are cancelled)."""
        self._pending.drop()
        self._lowered.clear()

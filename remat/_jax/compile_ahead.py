"""Measuring compiles run on worker threads, so that one can run ahead of the search.

XLA compiles without holding Python's lock, and a measuring compile on CPU keeps
one core busy (``program.MEASURE_OPTIONS``). So while the search waits for the
compile of the plan it asked for, the plan it may ask for next compiles beside it
(:meth:`remat.core.search.Frontier.point`'s ``ahead``), and the plain program
compiles while its columns are built.

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
import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["WORKERS", "Pending"]

#: Compiles at once: the one the search waits for and one ahead of it.
WORKERS = 2

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


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

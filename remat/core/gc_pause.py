"""A context manager that pauses Python's cyclic garbage collector."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pauses the cyclic garbage collector while planning.

    Building graphs allocates many small tuples and nothing cyclic; full
    collections over a large live jaxpr would otherwise cost a third of the
    planning time.

    >>> with gc_paused():
    ...     pass
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

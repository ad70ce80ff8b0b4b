"""The jaxpr types and helpers the jaxpr-to-graph adapter uses.

Public names come from ``jax.extend.core``; the one internal used (JAX's source
locations, to print an equation's user source line) comes through ``compat.py``,
the only module that imports ``jax._src``.
"""

from __future__ import annotations

import re
from typing import Any

from jax.extend.core import ClosedJaxpr, DropVar, Jaxpr, JaxprEqn, Literal, Var

from .compat import source_info_util as _source_info_util

__all__ = ["ClosedJaxpr", "DropVar", "Jaxpr", "JaxprEqn", "Literal", "Var",
           "source_line", "open_jaxpr_and_consts"]


_SOURCE_LINES: dict[tuple[Any, int], str] = {}


#: Frames of installed model libraries, skipped when a user frame is below them.
_LIBRARIES = re.compile(r"[\\/](site|dist)-packages[\\/](flax|equinox|haiku|optax)[\\/]")


def source_line(eqn: JaxprEqn) -> str:
    """The user source line of an equation, e.g. ``"model.py:12:8 (loss)"``.

    The innermost frame outside JAX and outside the installed model libraries
    (Flax, Equinox, Haiku, optax: their ``nn.scan`` is not the user's line) wins;
    if every frame outside JAX is theirs, the innermost of those. Formatted lines
    are cached by code location, since a traced loop repeats the same few lines.
    """
    traceback = eqn.source_info.traceback
    if traceback is None:
        return ""
    codes, lastis = traceback.raw_frames()
    frames = [(code, lasti) for code, lasti in zip(codes, lastis)
              if _source_info_util.is_user_filename(code.co_filename)]
    own = [f for f in frames if not _LIBRARIES.search(f[0].co_filename)]
    for code, lasti in (own or frames)[:1]:
        key = (code, lasti)
        line = _SOURCE_LINES.get(key)
        if line is None:
            frame = _source_info_util.raw_frame_to_frame(code, lasti)
            line = f"{frame.file_name}:{frame.start_line} ({frame.function_name})"
            if len(_SOURCE_LINES) < 100_000:
                _SOURCE_LINES[key] = line
        return line
    return ""


def open_jaxpr_and_consts(jaxpr: Any) -> tuple[Jaxpr, list[Any]]:
    """``(jaxpr, consts)`` from a ``ClosedJaxpr`` or an open ``Jaxpr``."""
    if isinstance(jaxpr, ClosedJaxpr):
        return jaxpr.jaxpr, list(jaxpr.consts)
    if isinstance(jaxpr, Jaxpr):
        return jaxpr, []
    raise TypeError(f"expected a Jaxpr or ClosedJaxpr, got {type(jaxpr).__name__}.")

"""Files the automatic pass writes when asked (``dump_to=``, ``REMAT_FLAGS``)."""

from __future__ import annotations

import pathlib

from remat.core.options import RematOptions

__all__ = ["dump_plan"]


def dump_plan(plan, options: RematOptions) -> None:
    """Writes ``plan.txt`` (the plan and its recomputed ops) to ``options.dump_to``,
    and, as ``options`` asks, ``before.dot``/``after.dot`` and ``memlog.txt``."""
    if not options.dump_to:
        return
    out = pathlib.Path(options.dump_to)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.txt").write_text(str(plan) + "\n" + "\n".join(plan.recomputed) + "\n")
    if options.dump_dot:
        (out / "before.dot").write_text(plan.to_dot(after=False))
        (out / "after.dot").write_text(plan.to_dot(after=True))
    if options.dump_memlog:
        (out / "memlog.txt").write_text(plan.memlog())

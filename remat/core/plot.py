"""A PNG of the memory timeline (matplotlib, Agg backend, imported lazily)."""

from __future__ import annotations

import os
from typing import AbstractSet

from .graph import Graph
from .simulate import Timeline

__all__ = ["plot_timeline"]


def plot_timeline(graph: Graph, timeline: Timeline, path: str | os.PathLike,
                  *, title: str = "", limit_bytes: int | None = None,
                  recomputed: AbstractSet[int] = frozenset()) -> None:
    """Writes a PNG of the bytes live at each step of ``timeline`` to ``path``.

    Arguments:
      graph: the program the timeline was simulated on.
      timeline: from ``remat.core.simulate.simulate``.
      path: where to write the PNG.
      title: the figure title.
      limit_bytes: draws a memory limit line when given.
      recomputed: op ids a plan recomputes; marked on the time axis.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt  # imported here: planning never needs it

    mib = 1024.0 * 1024.0
    steps = list(range(len(timeline.schedule)))
    during = [b / mib for b in timeline.live_during_bytes]
    resident = (timeline.input_bytes + timeline.output_bytes) / mib
    fig, ax = plt.subplots(figsize=(10, 4))
    try:
        ax.fill_between(steps, during, step="mid", alpha=0.35, label="live while running")
        ax.plot(steps, during, drawstyle="steps-mid", linewidth=0.8)
        ax.axhline(resident, color="gray", linestyle=":", label="inputs + outputs")
        if timeline.peak_step >= 0:
            ax.plot([timeline.peak_step], [timeline.peak_bytes / mib], "rv",
                    label=f"peak {timeline.peak_bytes / mib:.1f} MiB")
        if limit_bytes is not None:
            ax.axhline(limit_bytes / mib, color="red", linestyle="--", label="limit")
        marked = [s for s, op_id in enumerate(timeline.schedule) if op_id in recomputed]
        if marked:
            ax.plot(marked, [0.0] * len(marked), "|", color="orange", markersize=12,
                    label="recomputed")
        ax.set_xlabel("step")
        ax.set_ylabel("MiB")
        ax.set_title(title or f"memory timeline ({len(graph.ops)} ops)")
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        fig.savefig(os.fspath(path), dpi=100)
    finally:
        plt.close(fig)

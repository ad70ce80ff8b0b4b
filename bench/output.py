"""Where the benchmarks write their tables and plots.

On the CPU the files are ``bench/results/NAME.md``/``.png`` (the README's tables);
on another backend the backend's name is added (``NAME_gpu.md``), so that a run on a
GPU machine sits beside the CPU figures instead of replacing them.
"""

from __future__ import annotations

import pathlib

import jax

RESULTS = pathlib.Path(__file__).parent / "results"


def result_file(name: str, suffix: str = ".md") -> pathlib.Path:
    """``bench/results/NAME[_BACKEND]SUFFIX``, the folder made if missing."""
    RESULTS.mkdir(exist_ok=True)
    backend = jax.default_backend()
    tag = "" if backend == "cpu" else f"_{backend}"
    return RESULTS / f"{name}{tag}{suffix}"

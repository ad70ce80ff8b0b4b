"""remat: rematerialization (activation checkpointing) for JAX.

This module only re-exports the public API; see the submodules for the code.
"""

from ._analyze import analyze as analyze, MemoryReport as MemoryReport

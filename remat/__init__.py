"""remat: rematerialization (activation checkpointing) for JAX.

This module only re-exports the public API; the code lives in the submodules.

The planning core (``remat.core``) needs no JAX, so the JAX-facing names below are
imported only when JAX can be imported; without JAX, using one of them raises an
``ImportError`` that says so, while ``import remat.core.graph`` and the planners work.
The framework adapters live in ``remat.flax`` (linen), ``remat.nnx`` (Flax NNX) and
``remat.equinox``, imported on demand (each imports its framework).
"""

_JAX_NAMES = ("MemoryLimitError", "MemoryReport", "Plan", "analyze", "checkpoint",
              "checkpoint_name", "checkpoint_policies", "jit", "pareto", "plan",
              "print_saved_residuals", "remat", "saved_residuals")

try:
    import jax as _jax
except ImportError as _error:
    _JAX_IMPORT_ERROR: ImportError | None = _error
else:
    _JAX_IMPORT_ERROR = None
    del _jax

if _JAX_IMPORT_ERROR is None:
    from remat._analyze import MemoryReport as MemoryReport
    from remat._analyze import analyze as analyze
    from remat._jax import lowering as _lowering  # registers the lowering rules
    from remat._jax.auto import MemoryLimitError as MemoryLimitError
    from remat._jax.auto import Plan as Plan
    from remat._jax.auto import jit as jit
    from remat._jax.auto import plan as plan
    from remat._jax.checkpoint import checkpoint as checkpoint
    from remat._jax.checkpoint import checkpoint_name as checkpoint_name
    from remat._jax.checkpoint import remat as remat
    from remat._jax.pareto import pareto as pareto
    from remat._jax.residuals import print_saved_residuals as print_saved_residuals
    from remat._jax.residuals import saved_residuals as saved_residuals
    from remat._policies import checkpoint_policies as checkpoint_policies

    del _lowering
else:
    def __getattr__(name: str):
        if name in _JAX_NAMES:
            raise ImportError(
                f"remat.{name} needs JAX, which cannot be imported here "
                f"({_JAX_IMPORT_ERROR}). Install a supported release with "
                "`pip install 'jax>=0.10.2,<0.11'` (installing remat with pip does "
                "it too); the planning core, remat.core, works without it.")
        raise AttributeError(f"module 'remat' has no attribute {name!r}")

__all__ = list(_JAX_NAMES)
__version__ = "0.1.0"

"""remat: rematerialization (activation checkpointing) for JAX.

This module only re-exports the public API; the code lives in the submodules.
"""

from remat._analyze import MemoryReport as MemoryReport
from remat._analyze import analyze as analyze
from remat._jax import lowering as _lowering  # registers the lowering rules
from remat._jax.auto import MemoryLimitError as MemoryLimitError
from remat._jax.auto import Plan as Plan
from remat._jax.auto import jit as jit
from remat._jax.auto import plan as plan
from remat._jax.pareto import pareto as pareto
from remat._jax.checkpoint import checkpoint as checkpoint
from remat._jax.checkpoint import checkpoint_name as checkpoint_name
from remat._jax.checkpoint import remat as remat
from remat._jax.residuals import print_saved_residuals as print_saved_residuals
from remat._jax.residuals import saved_residuals as saved_residuals
from remat._policies import checkpoint_policies as checkpoint_policies

del _lowering

__version__ = "0.1.0"

"""Flax linen adapter: ``remat.flax.remat`` (alias ``checkpoint``) is a drop-in for
``flax.linen.remat`` built on ``remat.checkpoint``. Importing this module imports
Flax (``pip install 'remat[flax]'``). Re-exports only; the code is in
``remat/_jax/flax_adapter.py``."""

from remat._jax.flax_adapter import checkpoint as checkpoint
from remat._jax.flax_adapter import lifted_checkpoint as lifted_checkpoint
from remat._jax.flax_adapter import remat as remat

__all__ = ["checkpoint", "lifted_checkpoint", "remat"]

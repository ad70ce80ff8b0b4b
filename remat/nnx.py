"""Flax NNX adapter: ``remat.nnx.remat`` (alias ``checkpoint``) is a drop-in for
``flax.nnx.remat`` built on ``remat.checkpoint``, carrying module state (RNG
counts, batch statistics) in and out. Importing this module imports Flax
(``pip install 'remat[flax]'``). Re-exports only; the code is in
``remat/_jax/nnx_adapter.py``."""

from remat._jax.nnx_adapter import checkpoint as checkpoint
from remat._jax.nnx_adapter import remat as remat

__all__ = ["checkpoint", "remat"]

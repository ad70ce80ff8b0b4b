"""Equinox adapter: ``remat.equinox.filter_checkpoint`` is a drop-in for
``eqx.filter_checkpoint`` built on ``remat.checkpoint``. Importing this module
imports Equinox (``pip install 'remat[equinox]'``). Re-exports only; the code is in
``remat/_jax/equinox_adapter.py``."""

from remat._jax.equinox_adapter import filter_checkpoint as filter_checkpoint

__all__ = ["filter_checkpoint"]

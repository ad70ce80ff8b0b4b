"""remat: rematerialization (activation checkpointing) for JAX.

This module only re-exports the public API; see the submodules for the code.
"""

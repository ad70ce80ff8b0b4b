"""Saving policies: which intermediates a checkpointed function keeps for its backward.

A policy is called as ``policy(prim, *avals, **params)`` for each equation of the
checkpointed function whose output differentiation could save, with the JAX
primitive, the abstract values of its inputs and its parameters. It answers True
(save the output), False (recompute it), or, for the offloading policies, a
request to move it to another memory space. These are the same names and the same
protocol as ``jax.checkpoint_policies``, so a user's own policy works unchanged,
and names given by :func:`remat.checkpoint_name` are seen by JAX's policies too.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass

import jax

from remat._jax.compat import Offloadable, Recompute, Saveable, name_p

Policy = Callable[..., object]


def everything_saveable(*_, **__) -> bool:
    """Save everything: the same as no checkpoint at all."""
    return True


def nothing_saveable(*_, **__) -> bool:
    """Save nothing but the checkpointed function's inputs (the default)."""
    return False


def _no_batch_dims(params) -> bool:
    (_, _), (lhs_batch, rhs_batch) = params["dimension_numbers"]
    return not lhs_batch and not rhs_batch


@dataclass(frozen=True)
class _DotsSaveable:
    """Save the results of matrix multiplications and convolutions."""
    only_without_batch_dims: bool

    def __call__(self, prim, *avals, **params) -> bool:
        if prim is jax.lax.dot_general_p:
            return not self.only_without_batch_dims or _no_batch_dims(params)
        if prim is jax.lax.conv_general_dilated_p:
            return not self.only_without_batch_dims
        return False


dots_saveable = _DotsSaveable(False)
dots_with_no_batch_dims_saveable = _DotsSaveable(True)


def offload_dot_with_no_batch_dims(offload_src: str, offload_dst: str) -> Policy:
    """Like ``dots_with_no_batch_dims_saveable``, but move those values from memory
    space ``offload_src`` to ``offload_dst`` (e.g. "device" to "pinned_host") instead
    of keeping them on the device."""
    def policy(prim, *_, **params):
        if prim is jax.lax.dot_general_p and _no_batch_dims(params):
            return Offloadable(src=offload_src, dst=offload_dst)
        return Recompute
    return policy


@dataclass(frozen=True)
class _NamePolicy:
    """Save values named by ``checkpoint_name``: those in ``names`` when
    ``inclusive``, all others otherwise. Unnamed values are never saved."""
    names: frozenset[str]
    inclusive: bool

    def __call__(self, prim, *_, **params) -> bool:
        if prim is not name_p:
            return False
        return (params["name"] in self.names) == self.inclusive


def save_only_these_names(*names: str) -> Policy:
    """Save only values named (by ``checkpoint_name``) with one of ``names``."""
    return _NamePolicy(frozenset(names), inclusive=True)


def save_any_names_but_these(*names: str) -> Policy:
    """Save every named value except those named with one of ``names``."""
    return _NamePolicy(frozenset(names), inclusive=False)


@dataclass(frozen=True)
class _SaveAllButNames:
    names: frozenset[str]

    def __call__(self, prim, *_, **params) -> bool:
        return not (prim is name_p and params["name"] in self.names)


def save_anything_except_these_names(*names: str) -> Policy:
    """Save every value, named or not, except those named with one of ``names``.

    Values computed from a name's input after it is named are recomputed only if
    they are reachable through the name; give names to the values that matter.
    """
    return _SaveAllButNames(frozenset(names))


def save_and_offload_only_these_names(
    *, names_which_can_be_saved, names_which_can_be_offloaded,
    offload_src: str, offload_dst: str) -> Policy:
    """Save the values named in ``names_which_can_be_saved``, offload those named in
    ``names_which_can_be_offloaded`` from ``offload_src`` to ``offload_dst``, and
    recompute everything else."""
    saved = frozenset(names_which_can_be_saved)
    offloaded = frozenset(names_which_can_be_offloaded)
    if saved & offloaded:
        raise ValueError(
            "names_which_can_be_saved and names_which_can_be_offloaded must not "
            f"overlap, but both contain {sorted(saved & offloaded)}; put each name in "
            "one of them.")

    def policy(prim, *_, **params):
        if prim is name_p and params["name"] in saved:
            return Saveable
        if prim is name_p and params["name"] in offloaded:
            return Offloadable(src=offload_src, dst=offload_dst)
        return Recompute
    return policy


def save_from_both_policies(policy_1: Policy, policy_2: Policy) -> Policy:
    """Save a value when either policy saves it (both must answer with a bool)."""
    def policy(prim, *args, **params):
        a, b = policy_1(prim, *args, **params), policy_2(prim, *args, **params)
        if not (isinstance(a, bool) and isinstance(b, bool)):
            raise ValueError(
                f"save_from_both_policies combines policies that answer True or False, "
                f"but got {a!r} and {b!r}; write a custom policy for offloading ones.")
        return a or b
    return policy


checkpoint_policies = types.SimpleNamespace(
    everything_saveable=everything_saveable,
    nothing_saveable=nothing_saveable,
    dots_saveable=dots_saveable,
    checkpoint_dots=dots_saveable,
    dots_with_no_batch_dims_saveable=dots_with_no_batch_dims_saveable,
    checkpoint_dots_with_no_batch_dims=dots_with_no_batch_dims_saveable,
    offload_dot_with_no_batch_dims=offload_dot_with_no_batch_dims,
    save_anything_except_these_names=save_anything_except_these_names,
    save_any_names_but_these=save_any_names_but_these,
    save_only_these_names=save_only_these_names,
    save_from_both_policies=save_from_both_policies,
    save_and_offload_only_these_names=save_and_offload_only_these_names,
)

"""``remat.flax``: ``remat.checkpoint`` on Flax linen modules, lifted as Flax lifts
``jax.checkpoint``.

Flax's ``nn.remat`` (``nn.checkpoint``) calls ``jax.checkpoint``, whose recomputation
XLA:CPU merges back into the forward pass. :func:`checkpoint` is the same transform
with ``remat.checkpoint`` inside: it takes the same arguments, lifts the module's
variable collections and RNG streams through Flax's lifting API (``flax.core.lift.pack``
and ``nn.transforms.lift_transform``), and composes with the other lifted
transforms, ``nn.scan`` included.

Rule: the module's variables and RNGs enter the checkpointed function as arguments
(so their gradients flow) and come back out as its results (so mutable collections
such as ``batch_stats`` are updated); ``static_argnums`` counts the module's own
``__call__`` arguments, ``self`` being argument 0, as in ``nn.remat``.

Example::

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from remat.flax import remat
    >>> class MLP(nn.Module):
    ...     @nn.compact
    ...     def __call__(self, x):
    ...         for _ in range(3):
    ...             x = remat(nn.Dense)(8)(x)
    ...         return x
    >>> x = jnp.ones((2, 8))
    >>> params = MLP().init(jax.random.key(0), x)
    >>> grads = jax.grad(lambda p: MLP().apply(p, x).sum())(params)
    >>> grads["params"]["CheckpointDense_0"]["kernel"].shape   # nn.remat's names
    (8, 8)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.core.lift as lift
import flax.linen as nn

from remat._jax.checkpoint import checkpoint as _checkpoint

__all__ = ["checkpoint", "remat", "lifted_checkpoint"]


def _argnums(static_argnums: int | Sequence[int], name: str) -> tuple[int, ...]:
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    if not all(isinstance(i, int) for i in nums):
        raise TypeError(f"{name}: static_argnums must be an int or a sequence of ints, "
                        f"got {static_argnums!r}.")
    return nums


def lifted_checkpoint(fn: Callable[..., Any], variables: Any = True, rngs: Any = True,
                      prevent_cse: bool = True, static_argnums: int | Sequence[int] = (),
                      policy: Callable[..., Any] | None = None,
                      lowering: str | None = None) -> Callable[..., Any]:
    """``flax.core.lift.checkpoint`` with ``remat.checkpoint`` inside: ``fn(scope,
    *args)`` recomputes its intermediates during differentiation.

    ``static_argnums`` counts ``fn``'s arguments after the scope (0 is the first of
    ``*args``)."""
    static = _argnums(static_argnums, "remat.flax.lifted_checkpoint")

    def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args, **kwargs):
        # The lifted function takes the variable and RNG groups first.
        @functools.partial(_checkpoint, prevent_cse=prevent_cse, policy=policy,
                           static_argnums=tuple(i + 2 if i >= 0 else i for i in static),
                           lowering=lowering)
        @functools.wraps(fn)
        def checkpointed(variable_groups, rng_groups, *args, **kwargs):
            scope = scope_fn(variable_groups, rng_groups)
            return fn(scope, *args, **kwargs), repack_fn(scope)

        return checkpointed(variable_groups, rng_groups, *args, **kwargs)

    return lift.pack(inner, (variables,), (variables,), (rngs,), name="remat",
                     enable_kwargs=True)


def _named_checkpoint(fn, *args, **kwargs):
    return lifted_checkpoint(fn, *args, **kwargs)


# Flax names a lifted module class after its transform ("Checkpoint" + the class's
# name); naming ours as nn.remat's keeps the parameter trees, and so saved
# parameters, interchangeable between the two.
_named_checkpoint.__name__ = "checkpoint"


def checkpoint(target: Any, variables: Any = True, rngs: Any = True,
               concrete: bool = False, prevent_cse: bool = True,
               static_argnums: int | Sequence[int] = (),
               policy: Callable[..., Any] | None = None,
               methods: Sequence[str] | None = None,
               lowering: str | None = None) -> Any:
    """A drop-in for ``flax.linen.checkpoint`` (``nn.remat``) built on
    ``remat.checkpoint``.

    Arguments are ``nn.checkpoint``'s: ``target`` is a ``Module`` class or a
    function taking a module; ``variables`` and ``rngs`` filter the lifted
    collections and RNG streams; ``static_argnums`` counts ``self`` as argument 0
    (so a ``train`` flag after ``x`` is ``static_argnums=(2,)``); ``policy`` is
    any ``remat.checkpoint_policies`` (or ``jax.checkpoint_policies``) entry;
    ``methods`` names the methods to lift (default ``__call__``). ``lowering`` is
    ``remat.checkpoint``'s. ``concrete=True`` is refused, as Flax refuses it.
    """
    if concrete:
        raise NotImplementedError(
            "remat.flax.checkpoint: concrete=True is not supported (nor by "
            "flax.linen.checkpoint); mark Python-valued arguments with static_argnums.")
    static = _argnums(static_argnums, "remat.flax.checkpoint")
    if 0 in static:
        raise ValueError("remat.flax.checkpoint: static_argnums counts `self` as "
                         "argument 0, which cannot be static; the first argument "
                         f"after self is 1. Got static_argnums={static_argnums!r}.")
    # lift_transform drops `self`, so positions from the start shift down by one
    # (positions from the end, negative, stay).
    static = tuple(i - 1 if i > 0 else i for i in static)
    return nn.transforms.lift_transform(
        _named_checkpoint, target, variables=variables, rngs=rngs,
        prevent_cse=prevent_cse, static_argnums=static, policy=policy,
        lowering=lowering, methods=methods)


remat = checkpoint

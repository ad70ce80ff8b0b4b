"""``remat.equinox``: ``remat.checkpoint`` for Equinox, filtered as Equinox filters.

``eqx.filter_checkpoint`` calls ``jax.checkpoint``, whose recomputation XLA:CPU
merges back into the forward pass. :func:`filter_checkpoint` takes the same
arguments and has the same rule for what is traced: array leaves (``eqx.is_array``)
of the arguments, and of the function itself when it is a module, are traced and
differentiated; every other leaf (activation functions, Python numbers, strings)
is static, so a new value retraces. Results may hold non-array leaves too; they
come back unchanged.

The wrapper is itself an ``eqx.Module`` holding the function, so a checkpointed
layer stored in a model keeps its parameters visible to ``eqx.filter_grad`` and
``eqx.filter_jit``; as a method decorator it binds ``self`` like a function.

Example::

    >>> import jax, jax.numpy as jnp, equinox as eqx
    >>> from remat.equinox import filter_checkpoint
    >>> mlp = eqx.nn.MLP(4, 4, 8, depth=2, activation=jax.nn.gelu,
    ...                  key=jax.random.key(0))
    >>> block = filter_checkpoint(mlp)
    >>> grads = eqx.filter_grad(lambda m, x: m(x).sum())(block, jnp.ones(4))
    >>> grads.fun.layers[0].weight.shape == mlp.layers[0].weight.shape   # the wrapper holds mlp
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from remat._jax.checkpoint import checkpoint as _checkpoint

__all__ = ["filter_checkpoint"]


@jax.tree_util.register_static
class _StaticOut:
    """Non-array results, carried in the output's structure (no leaves)."""
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _call(static: Any, dynamic: Any) -> tuple[Any, _StaticOut]:
    fun, args, kwargs = eqx.combine(dynamic, static)
    out = fun(*args, **kwargs)
    dynamic_out, static_out = eqx.partition(out, eqx.is_array)
    return dynamic_out, _StaticOut(static_out)


@functools.lru_cache(maxsize=None)
def _checkpointed_call(prevent_cse: bool, policy: Callable | None,
                       lowering: str | None) -> Callable:
    # One checkpointed function per setting, so remat.checkpoint's trace cache
    # (keyed by function and static values) is shared by every call.
    return _checkpoint(_call, static_argnums=(0,), prevent_cse=prevent_cse,
                       policy=policy, lowering=lowering)


class _FilterCheckpoint(eqx.Module):
    fun: Callable
    prevent_cse: bool = eqx.field(static=True)
    policy: Callable | None = eqx.field(static=True)
    lowering: str | None = eqx.field(static=True)

    @property
    def __wrapped__(self) -> Callable:
        return self.fun

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dynamic, static = eqx.partition((self.fun, args, kwargs), eqx.is_array)
        call = _checkpointed_call(self.prevent_cse, self.policy, self.lowering)
        dynamic_out, static_out = call(static, dynamic)
        return eqx.combine(dynamic_out, static_out.value)

    def __get__(self, instance: Any, owner: Any) -> Any:
        if instance is None:
            return self
        return jax.tree_util.Partial(self, instance)


def filter_checkpoint(fun: Callable | None = None, *, prevent_cse: bool = True,
                      policy: Callable[..., Any] | None = None,
                      lowering: str | None = None) -> Any:
    """A drop-in for ``eqx.filter_checkpoint`` built on ``remat.checkpoint``.

    ``fun`` is a function or a module; without it, returns a decorator.
    ``prevent_cse`` and ``policy`` are ``eqx.filter_checkpoint``'s (``policy``:
    any ``remat.checkpoint_policies`` or ``jax.checkpoint_policies`` entry);
    ``lowering`` is ``remat.checkpoint``'s.
    """
    if fun is None:
        return functools.partial(filter_checkpoint, prevent_cse=prevent_cse,
                                 policy=policy, lowering=lowering)
    if not callable(fun):
        raise TypeError(f"remat.equinox.filter_checkpoint: fun must be callable (a "
                        f"function or a module), got {fun!r}.")
    if not isinstance(prevent_cse, bool):
        raise TypeError("remat.equinox.filter_checkpoint: prevent_cse must be a bool, "
                        f"got {prevent_cse!r}.")
    return eqx.module_update_wrapper(_FilterCheckpoint(fun, prevent_cse, policy, lowering))

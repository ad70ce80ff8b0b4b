"""``remat.nnx``: ``remat.checkpoint`` for Flax NNX, carrying module state in and out.

``nnx.remat`` calls ``jax.checkpoint``, whose recomputation XLA:CPU merges back
into the forward pass. ``remat.checkpoint`` survives the compiler, but like
``jax.checkpoint`` it returns only the function's results, so a change the
function makes to a module (an RNG stream's count, batch statistics) would be
lost; it raises instead. :func:`remat` takes ``nnx.remat``'s arguments and
carries that state: the arguments are split into their graph definition
(static: structure, Python numbers) and their state (traced: every variable's
value, and array arguments), merged again inside the checkpointed call, and
each variable whose value the function changed is written back to the caller's
objects afterwards.

Rules: the function may change variables' values, not create or delete
variables (``sow`` included); its results are arrays or pytrees of them;
arguments named by ``static_argnums`` are hashable. A bound method of a module
is checkpointed with the module as its first argument.

Example::

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import remat.nnx
    >>> drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=0))
    >>> f = remat.nnx.remat(lambda d, x: d(x))
    >>> a, b = f(drop, jnp.ones(64)), f(drop, jnp.ones(64))
    >>> bool((a != b).any()), int(drop.rngs.count[...])   # the stream moved on
    (True, 2)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx

from remat._jax.checkpoint import checkpoint as _checkpoint

__all__ = ["checkpoint", "remat"]


@jax.tree_util.register_static
class _Changed:
    """The positions, among the state's leaves, of the values the function
    changed: carried in the output's structure (no leaves)."""
    __slots__ = ("positions",)

    def __init__(self, positions: tuple[int, ...]) -> None:
        self.positions = positions


def _call(fun: Callable, graphdef: Any, statics: tuple[tuple[int, Any], ...],
          variables: Any, rest: Any) -> tuple[Any, list, _Changed]:
    before, structure = jax.tree.flatten(variables)
    dynamic, kwargs = nnx.merge(graphdef, variables, rest)   # may share the variables
    args = list(dynamic)
    for position, value in statics:
        args.insert(position, value)
    out = fun(*args, **kwargs)
    after, structure_after = jax.tree.flatten(nnx.state((dynamic, kwargs), nnx.Variable))
    if structure_after != structure:
        raise ValueError(
            f"remat.nnx.remat: {getattr(fun, '__qualname__', fun)!r} created or deleted "
            "NNX variables (sow, a new attribute, a deleted one): a checkpointed call "
            "may change variables' values only. Create them before the call, or "
            "call the function outside remat.nnx.remat.")
    changed = tuple(k for k, (a, b) in enumerate(zip(before, after)) if a is not b)
    return out, [after[k] for k in changed], _Changed(changed)


@functools.lru_cache(maxsize=None)
def _checkpointed_call(prevent_cse: bool, policy: Callable | None,
                       lowering: str | None) -> Callable:
    # One checkpointed function per setting, so remat.checkpoint's trace cache
    # (keyed by function and static values) is shared by every call.
    return _checkpoint(_call, static_argnums=(0, 1, 2), prevent_cse=prevent_cse,
                       policy=policy, lowering=lowering)


def remat(fun: Callable | None = None, *, prevent_cse: bool = True,
          static_argnums: int | Sequence[int] = (), policy: Callable | None = None,
          lowering: str | None = None) -> Any:
    """A drop-in for ``nnx.remat`` built on ``remat.checkpoint`` (see the module
    docstring). Without ``fun``, returns a decorator. ``prevent_cse``,
    ``static_argnums`` and ``policy`` are ``nnx.remat``'s (``policy``: any
    ``remat.checkpoint_policies`` or ``jax.checkpoint_policies`` entry);
    ``lowering`` is ``remat.checkpoint``'s."""
    if fun is None:
        return functools.partial(remat, prevent_cse=prevent_cse,
                                 static_argnums=static_argnums, policy=policy,
                                 lowering=lowering)
    if not callable(fun):
        raise TypeError(f"remat.nnx.remat: fun must be callable, got {fun!r}.")
    if not isinstance(prevent_cse, bool):
        raise TypeError(f"remat.nnx.remat: prevent_cse must be a bool, got {prevent_cse!r}.")
    statics = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    if not all(isinstance(i, int) for i in statics):
        raise TypeError("remat.nnx.remat: static_argnums must be ints, got "
                        f"{static_argnums!r}.")
    bound = inspect.ismethod(fun)
    target = fun.__func__ if bound else fun
    call = _checkpointed_call(prevent_cse, policy, lowering)

    @functools.wraps(fun)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if bound:
            args = (fun.__self__, *args)
        positions = sorted({i % len(args) if -len(args) <= i < 0 else i for i in statics})
        if positions and positions[-1] >= len(args):
            raise ValueError(f"remat.nnx.remat: static_argnums={static_argnums!r} names "
                             f"argument {positions[-1]}, but the call passes {len(args)}.")
        given = tuple((i, args[i]) for i in positions)
        dynamic = tuple(a for i, a in enumerate(args) if i not in positions)
        graphdef, variables, rest = nnx.split((dynamic, kwargs), nnx.Variable, ...)
        out, values, changed = call(target, graphdef, given, variables, rest)
        if changed.positions:
            leaves, structure = jax.tree.flatten(variables)
            for k, value in zip(changed.positions, values):
                leaves[k] = value
            nnx.update((dynamic, kwargs), jax.tree.unflatten(structure, leaves))
        return out

    return checkpointed


checkpoint = remat

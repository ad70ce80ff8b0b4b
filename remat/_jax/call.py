"""A call as ``jax.jit`` takes it apart: static parts, dynamic inputs, results.

A call ``fun(*args, **kwargs)`` is split as ``jax.jit`` splits it, plus what
``equinox.filter_jit`` adds: arguments named by ``static_argnums`` /
``static_argnames`` are static (hashed, baked into the trace), and inside the other
arguments every leaf that is not an array (a function, a string, None, an
object), and a Python number inside an Equinox module, is static too. What
remains, the arrays and other Python numbers, are the program's dynamic inputs,
in a fixed order (:class:`CallSplit`); calls that split alike give one program.

>>> import numpy as np
>>> spec = CallSpec.of(lambda x, n: x * n, {"static_argnums": 1})
>>> split = CallSplit.of((np.ones(3), 2), {}, spec)
>>> len(split.dynamic), split.rebuild(split.dynamic)[0][1]
(1, 2)
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import sys
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from remat._jax.compat import core

__all__ = ["CallSpec", "CallSplit", "OutputTree", "is_dynamic", "placement"]

_NUMBERS = (bool, int, float, complex)


def is_dynamic(leaf: Any, in_module: bool = False) -> bool:
    """Whether a leaf is traced rather than static: an array, a
    ``jax.ShapeDtypeStruct`` (to plan and lower from shapes alone, as
    ``jax.jit(f).lower`` takes them), or a Python number
    (as ``jax.jit`` traces it) unless it sits ``in_module``, inside an Equinox
    module, where ``equinox.filter_jit`` keeps it static (a dropout rate, an
    ``inference`` flag: traced, ``if`` on it would fail and a gradient would be
    taken with respect to it, which an optimizer would then move)."""
    if isinstance(leaf, _NUMBERS):
        return not in_module
    return (isinstance(leaf, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))
            or hasattr(leaf, "__jax_array__"))


def _in_modules(tree: Any) -> Iterable[bool]:
    """For each leaf of ``tree`` (in ``tree_leaves`` order), whether it sits
    inside an Equinox module (none without Equinox imported)."""
    eqx = sys.modules.get("equinox")
    if eqx is None:
        return itertools.repeat(False)
    flags = []
    for node in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, eqx.Module)):
        if isinstance(node, eqx.Module):
            flags += [True] * len(jax.tree_util.tree_leaves(node))
        else:
            flags.append(False)
    return flags


@dataclasses.dataclass(frozen=True)
class OutputTree:
    """The structure of a traced function's results, with the leaves that are
    not traced (:func:`is_dynamic`: a function or a Python number inside a
    returned Equinox module, as ``equinox.filter_jit`` keeps them) kept aside as
    they were at trace time: the program returns the traced leaves only.

    A compiled program cannot return the kept leaves: it returns
    :meth:`placeholder` (None in their places), and :meth:`restore` puts them back.

    >>> import jax.numpy as jnp
    >>> out, leaves = OutputTree.of((jnp.ones(2), str.upper))
    >>> len(leaves), out.placeholder(leaves)[1], out.restore((jnp.ones(2), None))[1]
    (1, None, <method 'upper' of 'str' objects>)
    """
    tree: Any
    statics: tuple[tuple[int, Any], ...]     # (leaf position, value)

    @classmethod
    def of(cls, out: Any) -> tuple["OutputTree", list]:
        """``out``'s structure and its traced leaves."""
        leaves, tree = jax.tree_util.tree_flatten(out)
        statics, traced = [], []
        for k, (leaf, in_module) in enumerate(zip(leaves, _in_modules(out))):
            if isinstance(leaf, core.Tracer) or is_dynamic(leaf, in_module):
                traced.append(leaf)
            else:
                statics.append((k, leaf))
        return cls(tree, tuple(statics)), traced

    def placeholder(self, traced: Iterable) -> Any:
        """The results from the program's (traced) outputs, None for each kept leaf."""
        return self._filled(traced, [None] * len(self.statics))

    def restore(self, placeholder: Any) -> Any:
        """The results, from what :meth:`placeholder` made."""
        if not self.statics:
            return placeholder
        return self._filled(jax.tree_util.tree_leaves(placeholder),
                            [v for _, v in self.statics])

    def _filled(self, traced: Iterable, kept: list) -> Any:
        leaves = list(traced)
        for (k, _), value in zip(self.statics, kept):
            leaves.insert(k, value)
        return jax.tree_util.tree_unflatten(self.tree, leaves)


class _Static:
    """A whole static argument, kept as one leaf."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return type(other) is _Static and self.value == other.value

    def __hash__(self):
        return hash(self.value)


@dataclasses.dataclass(frozen=True)
class CallSpec:
    """Which arguments of ``fun`` are static or donated, by position and name,
    as ``jax.jit`` takes them (names and positions completed from ``fun``'s
    signature where it has one)."""
    static_argnums: frozenset[int] = frozenset()
    static_argnames: frozenset[str] = frozenset()
    donate_argnums: frozenset[int] = frozenset()
    donate_argnames: frozenset[str] = frozenset()
    in_shardings: Any = None

    @classmethod
    def of(cls, fun: Callable, jit_kwargs: dict) -> "CallSpec":
        """Takes ``static_*``, ``donate_*`` and ``in_shardings`` out of
        ``jit_kwargs``."""
        def take(key, kind):
            value = jit_kwargs.pop(key, None)
            if value is None:
                return set()
            try:
                items = {value} if isinstance(value, kind) else set(value)
            except TypeError:       # (neither one nor an iterable of them)
                items = {value}
            if not all(isinstance(v, kind) and not isinstance(v, bool) for v in items):
                raise ValueError(f"remat.jit: {key}={value!r}; accepted: "
                                 f"{'an int or ints' if kind is int else 'a str or strs'}.")
            return items
        spec = [take("static_argnums", int), take("static_argnames", str),
                take("donate_argnums", int), take("donate_argnames", str)]
        try:
            params = list(inspect.signature(fun).parameters.values())
        except (TypeError, ValueError):
            params = []
        positional = [p.name for p in params if p.kind in (
            p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for nums, names in ((spec[0], spec[1]), (spec[2], spec[3])):
            for i in list(nums):
                if -len(positional) <= i < len(positional):
                    names.add(positional[i])
            nums |= {i for i, name in enumerate(positional) if name in names}
        if spec[0] & spec[2] or spec[1] & spec[3]:
            raise ValueError("remat.jit: an argument cannot be both static and donated.")
        return cls(*map(frozenset, spec), jit_kwargs.pop("in_shardings", None))

    def _static(self, i: int, n: int) -> bool:
        return i in self.static_argnums or i - n in self.static_argnums

    def _donated(self, i: int, n: int) -> bool:
        return i in self.donate_argnums or i - n in self.donate_argnums


@dataclasses.dataclass(frozen=True)
class CallSplit:
    """One call, split into its dynamic leaves and the rest.

    Attributes:
      dynamic: the traced inputs, in the program's order.
      key: hashable; equal for calls that give the same program.
      donated: positions in ``dynamic`` of donated inputs.
      rebuild: dynamic leaves (or tracers) -> ``(args, kwargs)``.
      shardings: per dynamic leaf, the sharding ``in_shardings`` gives it (as
        ``jax.jit`` reads it: one entry per non-static positional argument, a
        prefix of its structure), or None.
    """
    dynamic: tuple
    key: Any
    donated: tuple[int, ...]
    rebuild: Callable[[Iterable], tuple[tuple, dict]]
    shardings: tuple = ()

    @classmethod
    def of(cls, args: tuple, kwargs: dict, spec: CallSpec) -> "CallSplit":
        n = len(args)
        entries = [(i, a, spec._static(i, n), spec._donated(i, n))
                   for i, a in enumerate(args)]
        entries += [(k, kwargs[k], k in spec.static_argnames, k in spec.donate_argnames)
                    for k in sorted(kwargs)]
        given = _positional_shardings(spec.in_shardings, [
            a for i, a, static, _ in entries[:n] if not static])
        trees, kinds, statics, dynamic, donated, shardings = [], [], [], [], [], []
        for _, value, static, donate in entries:
            leaves, tree = jax.tree_util.tree_flatten(_Static(value) if static else value)
            trees.append((tree, len(leaves)))
            placed = (next(given, None) if not static else None) if given else None
            placed = ([None] * len(leaves) if placed is None else placed)
            inside = _in_modules(value) if not static else [False]
            for leaf, sharding, in_module in zip(leaves, placed, inside):
                if isinstance(leaf, core.Tracer):
                    raise TypeError(
                        "remat.jit/remat.plan: an argument is a traced value (the "
                        "call is inside jax.grad, jax.vmap, jax.jit, a scan ...). "
                        "remat.jit plans and compiles a whole program for concrete "
                        "arguments, so it must be the outermost transformation: apply "
                        "the others inside it (remat.jit(jax.grad(loss)), not "
                        "jax.grad(remat.jit(loss))). Inside a traced function, "
                        "checkpoint by hand with remat.checkpoint.")
                dyn = is_dynamic(leaf, in_module)
                kinds.append(dyn)
                if dyn:
                    donated += [len(dynamic)] if donate else []
                    dynamic.append(leaf)
                    shardings.append(sharding)
                else:
                    statics.append(leaf)
        try:
            hash(tuple(statics))
        except TypeError as e:
            raise ValueError(f"remat.jit: a static argument or non-array leaf is not "
                             f"hashable ({e}); static values must be hashable, as for "
                             "jax.jit's static_argnums.") from None
        names = [k for k, *_ in entries]

        def rebuild(dyn):
            return _assemble(trees, kinds, statics, list(dyn), names, n)

        avals = tuple((core.shaped_abstractify(x), placement(x)) for x in dynamic)
        key = (tuple(names), n, tuple(t for t, _ in trees), tuple(kinds), tuple(statics),
               avals, tuple(donated), tuple(map(repr, shardings)))
        return cls(tuple(dynamic), key, tuple(donated), rebuild, tuple(shardings))


def _positional_shardings(in_shardings: Any, args: list) -> Any:
    """An iterator over the positional arguments ``args`` (the non-static ones)
    of ``in_shardings`` broadcast to each one's leaves (a list per argument), or
    None when not given. A single sharding applies to every argument."""
    if in_shardings is None:
        return None
    if not isinstance(in_shardings, (tuple, list)):
        in_shardings = (in_shardings,) * len(args)
    if len(in_shardings) != len(args):
        raise ValueError(f"remat.jit: in_shardings has {len(in_shardings)} entries for "
                         f"{len(args)} non-static positional arguments; give one "
                         "(a sharding, None, or a prefix of the argument's structure) "
                         "per argument, as for jax.jit.")
    is_spec = lambda s: s is None or isinstance(s, jax.sharding.Sharding)
    return iter([jax.tree_util.tree_leaves(jax.tree.broadcast(s, a, is_leaf=is_spec),
                                           is_leaf=is_spec)
                 for s, a in zip(in_shardings, args)])


def _assemble(trees, kinds, statics, dyn, names, n):
    """``(args, kwargs)`` from the dynamic leaves ``dyn`` and the static ones."""
    dyn, stat = iter(dyn), iter(statics)
    built, pos = [], 0
    for tree, count in trees:
        leaves = [next(dyn) if kinds[pos + j] else next(stat) for j in range(count)]
        pos += count
        value = jax.tree_util.tree_unflatten(tree, leaves)
        built.append(value.value if isinstance(value, _Static) else value)
    return tuple(built[:n]), dict(zip(names[n:], built[n:]))



def placement(x, given=None):
    """The sharding an input is compiled for: the one given, or its own if it
    spans several devices; None for one device (a Python number's too)."""
    sharding = given if given is not None else getattr(x, "sharding", None)
    return sharding if sharding is not None and len(sharding.device_set) > 1 else None

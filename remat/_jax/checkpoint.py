"""``checkpoint``/``remat`` and ``checkpoint_name``: the user-facing transformation.

``checkpoint(fun)`` traces ``fun`` once per argument structure (and per value of its
static arguments) and binds ``remat_p`` on the result; the rules in
``primitive.py`` and the lowering in ``lowering.py`` do the rest.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax

from remat._jax import compat
from remat._jax.compat import core, name_p
from remat._jax import refs
from remat._jax.lowering import STRATEGIES
from remat._jax.primitive import remat_p

_CONCRETIZATION_HINT = (
    "\n\nInside remat.checkpoint the arguments are abstract, so Python control flow "
    "cannot depend on their values. If the value is a configuration (a flag, a "
    "size, a mode), mark that argument static: remat.checkpoint(f, "
    "static_argnums=(i,)) or static_argnames=('name',), as with jax.jit. "
    "Otherwise use jax.lax.cond / "
    "jax.lax.while_loop, or compute the value outside and close over it.")


def checkpoint(fun: Callable, *, prevent_cse: bool | Sequence[bool] = True,
               policy: Callable[..., Any] | None = None,
               static_argnums: int | Sequence[int] = (),
               static_argnames: str | Sequence[str] = (),
               lowering: str | None = None,
               ref_effects: str = "once") -> Callable:
    """Makes ``fun`` recompute its intermediates during differentiation instead of
    storing them: a drop-in for ``jax.checkpoint`` whose recomputation the XLA
    compiler cannot undo.

    Arguments:
      fun: the function to checkpoint; any pytrees in and out. A change it
        makes to its arguments (a field or item of a mutable one set anew, as a
        Flax NNX variable's update does) must also be returned: only results
        come out, so else it would be lost, and a ``ValueError`` says so
        (``jax.checkpoint`` drops it silently). ``remat.nnx.remat`` carries it.
      prevent_cse: protect the recomputation from being merged back into the
        forward pass (a bool, or one bool per positional argument pytree). Turning
        it off is only safe where a loop already separates the two (``lax.scan``).
      policy: which intermediates may be saved anyway, e.g.
        ``remat.checkpoint_policies.dots_saveable``; ``None`` saves only the inputs.
      static_argnums: positional arguments that are Python values (flags, sizes),
        not arrays; ``fun`` is retraced for each new value. Static values need
        not be hashable: an unhashable one (a dict of settings) is closed over
        and its trace reused only for the same object.
      static_argnames: parameters, by name, whose values are static in the same
        way, whether the call passes them by keyword or by position (a str or
        a sequence of str; each must name a parameter of ``fun`` unless it takes
        ``**kwargs``).
      lowering: how the recomputation is protected in the compiled program:
        ``"gate"``, ``"cond"``, ``"barrier"``, ``"while"``, or ``None`` for the
        platform's default (``"gate"`` on CPU, ``"barrier"`` on GPU/TPU).
      ref_effects: what happens to refs (``jax.new_ref``) that ``fun`` takes as
        arguments or closes over. ``"once"`` (default): their reads and writes
        happen once, in the forward pass; the recomputation starts from the values
        they held when ``fun`` was entered, in private copies. A ref that ``fun``
        hands to a ``jax.custom_vjp`` is the caller's ref in the backward pass:
        what the backward rule writes to it lands there, once per backward pass,
        and forward reads of it are saved, not repeated. ``"replay"``: the
        recomputation reads and writes the refs again, as ``jax.checkpoint``
        does; backward-rule writes land in the caller's refs in this mode too.

    Returns:
      A function with the same signature and values as ``fun``.

    >>> import jax, jax.numpy as jnp, remat
    >>> @remat.checkpoint
    ... def block(w, x):
    ...   return jnp.tanh(jnp.tanh(x @ w) @ w)
    >>> w, x = jnp.eye(4) * 0.5, jnp.ones((2, 4))
    >>> g = jax.grad(lambda w: block(w, x).sum())(w)
    >>> g.shape
    (4, 4)
    """
    if not callable(fun):
        raise TypeError(f"remat.checkpoint: fun must be callable, got {fun!r}.")
    static_argnums = _check_static_argnums(static_argnums)
    static_argnames = _check_static_argnames(static_argnames, fun)
    name_positions = _positions_of_names(fun, static_argnames)
    prevent_cse = _check_prevent_cse(prevent_cse)
    if lowering is not None and lowering not in STRATEGIES:
        raise ValueError(f"remat.checkpoint: lowering must be one of {STRATEGIES} or "
                         f"None, got {lowering!r}.")
    if ref_effects not in refs.REF_EFFECTS:
        raise ValueError(f"remat.checkpoint: ref_effects must be one of "
                         f"{refs.REF_EFFECTS}, got {ref_effects!r}.")
    if policy is not None and not callable(policy):
        raise TypeError("remat.checkpoint: policy must be callable as "
                        f"policy(prim, *avals, **params), got {policy!r}; see "
                        "remat.checkpoint_policies.")

    @functools.wraps(fun)
    def checkpointed(*args, **kwargs):
        positions = _static_positions(static_argnums, name_positions, len(args))
        dyn_fun, dyn_args, dyn_kwargs = _split_static(fun, positions, static_argnames,
                                                      args, kwargs)
        flat_args, in_tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
        in_avals = tuple(core.shaped_abstractify(x) for x in flat_args)
        dbg = compat.debug_info("remat.checkpoint", fun, args, kwargs,
                                static_argnums=tuple(sorted(positions)),
                                static_argnames=tuple(k for k in kwargs
                                                      if k in static_argnames))
        jaxpr, consts, out_tree = _trace(dyn_fun, in_tree, in_avals,
                                         refs.ref_kinds(in_avals), dbg)
        cse = _flat_prevent_cse(prevent_cse, len(consts), dyn_args, dyn_kwargs,
                                positions, len(args))
        params = dict(differentiated=False, policy=policy, lowering=lowering, num_late=0)
        if refs.needs_purify(jaxpr, ref_effects):
            outs = _bind_pure(jaxpr, [*consts, *flat_args], cse, params,
                              discharge_inputs=ref_effects == "once")
        else:
            outs = remat_p.bind(*consts, *flat_args, jaxpr=jaxpr, prevent_cse=cse,
                                **params)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    return checkpointed


def remat(fun: Callable, *, prevent_cse: bool | Sequence[bool] = True,
          policy: Callable[..., Any] | None = None,
          static_argnums: int | Sequence[int] = (),
          static_argnames: str | Sequence[str] = (),
          lowering: str | None = None, ref_effects: str = "once") -> Callable:
    """Alias of :func:`checkpoint`."""
    return checkpoint(fun, prevent_cse=prevent_cse, policy=policy,
                      static_argnums=static_argnums, static_argnames=static_argnames,
                      lowering=lowering, ref_effects=ref_effects)


def _bind_pure(jaxpr: core.Jaxpr, args: list[Any], prevent_cse, params,
               discharge_inputs: bool):
    """Binds the region with its refs turned into values (``refs.py``): external
    refs, if ``discharge_inputs``, are read before and written back after, so that
    their effects happen once; internal refs become plain values."""
    region = refs.purify(jaxpr, discharge_inputs)
    positions = set(region.ref_positions)
    values = [refs.read(a) if i in positions else a for i, a in enumerate(args)]
    if not isinstance(prevent_cse, bool):
        prevent_cse = (False,) * len(region.consts) + tuple(prevent_cse)
    outs = remat_p.bind(*region.consts, *values, jaxpr=region.jaxpr,
                        prevent_cse=prevent_cse, **params)
    num_outs = len(jaxpr.outvars)
    for i, written, final in zip(region.ref_positions, region.written,
                                 outs[num_outs:]):
        if written:
            refs.write(args[i], final)
    return outs[:num_outs]


def checkpoint_name(x: Any, name: str) -> Any:
    """Names ``x`` (an array or pytree of arrays) for the name-based policies.

    It is the identity on values. The name is the same one ``jax.ad_checkpoint.
    checkpoint_name`` gives, so JAX's policies see it too.

    >>> import jax.numpy as jnp, remat
    >>> policy = remat.checkpoint_policies.save_only_these_names("hidden")
    >>> f = remat.checkpoint(lambda x: jnp.sin(remat.checkpoint_name(jnp.cos(x),
    ...                      "hidden")), policy=policy)
    >>> [src.split(" from ")[0] for _, src in remat.saved_residuals(f, jnp.ones(2))]
    ['from the argument x', "named 'hidden'"]
    """
    if not isinstance(name, str):
        raise TypeError(f"checkpoint_name: name must be a str, got {name!r}.")
    return jax.tree_util.tree_map(lambda leaf: name_p.bind(leaf, name=name), x)


# ------------------------------------------------------------------- arguments

def _check_static_argnums(static_argnums) -> tuple[int, ...]:
    if isinstance(static_argnums, int) and not isinstance(static_argnums, bool):
        return (static_argnums,)
    if (isinstance(static_argnums, (tuple, list)) and
        all(isinstance(i, int) and not isinstance(i, bool) for i in static_argnums)):
        return tuple(static_argnums)
    raise TypeError(
        "remat.checkpoint: static_argnums must be an int or a tuple of ints "
        f"(positions of positional arguments), got {static_argnums!r}.")


def _check_static_argnames(static_argnames, fun) -> frozenset[str]:
    """The names as a set, each checked to name a parameter ``fun`` can take by
    keyword (any name, if ``fun`` takes ``**kwargs`` or has no signature)."""
    names = ((static_argnames,) if isinstance(static_argnames, str) else
             tuple(static_argnames) if isinstance(
                 static_argnames, (tuple, list, set, frozenset)) else None)
    if names is None or not all(isinstance(n, str) for n in names):
        raise TypeError(
            "remat.checkpoint: static_argnames must be a str or a sequence of str "
            f"(parameter names), got {static_argnames!r}.")
    params = _parameters(fun)
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params):
        return frozenset(names)
    by_name = {p.name: p for p in params}
    unknown = sorted(n for n in names if n not in by_name or
                     by_name[n].kind in (by_name[n].POSITIONAL_ONLY,
                                         by_name[n].VAR_POSITIONAL))
    if unknown:
        takes = ", ".join(p.name for p in params
                          if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        raise ValueError(
            f"remat.checkpoint: invalid argnames {unknown} in static_argnames: "
            f"{getattr(fun, '__name__', repr(fun))} takes no argument of that name by "
            f"keyword (it takes: {takes or 'none'}). Name its parameters, or mark "
            "positional-only ones with static_argnums.")
    return frozenset(names)


def _parameters(fun):
    try:
        return list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return None


def _positions_of_names(fun, names: frozenset[str]) -> dict[int, str]:
    """Positions at which a call may pass the parameters in ``names``."""
    params = _parameters(fun) or []
    return {i: p.name for i, p in enumerate(params)
            if p.kind is p.POSITIONAL_OR_KEYWORD and p.name in names}


def _static_positions(static_argnums, name_positions, nargs: int) -> frozenset[int]:
    for i in static_argnums:
        if not -nargs <= i < nargs:
            raise ValueError(
                f"remat.checkpoint: static_argnums contains {i}, but the function was "
                f"called with {nargs} positional argument(s), so valid positions are "
                f"{-nargs}..{nargs - 1}. Pass static values positionally, or name "
                "them in static_argnames.")
    return frozenset([i % nargs for i in static_argnums] +
                     [i for i in name_positions if i < nargs])


def _check_prevent_cse(prevent_cse):
    if isinstance(prevent_cse, bool):
        return prevent_cse
    if isinstance(prevent_cse, (tuple, list)) and all(
        isinstance(p, bool) for p in jax.tree_util.tree_leaves(prevent_cse)):
        return tuple(prevent_cse)
    raise TypeError("remat.checkpoint: prevent_cse must be a bool or a tuple of bools "
                    f"(one per positional argument), got {prevent_cse!r}.")


def _flat_prevent_cse(prevent_cse, num_consts, dyn_args, kwargs, static, nargs):
    if isinstance(prevent_cse, bool):
        return prevent_cse
    per_arg = [(i, p) for i, p in enumerate(prevent_cse) if i not in static]
    if len(per_arg) != len(dyn_args):
        raise ValueError(
            f"remat.checkpoint: prevent_cse has {len(prevent_cse)} entries but the "
            f"function was called with {nargs} positional arguments; give one bool "
            "per positional argument (static ones included), or a single bool.")
    flags = []
    for (i, p), a in zip(per_arg, dyn_args):
        flags += _leaf_flags(p, a, i)
    flags += [True] * len(jax.tree_util.tree_leaves(kwargs))
    return (False,) * num_consts + tuple(flags)


def _leaf_flags(flags, arg, position: int) -> list[bool]:
    """One flag per leaf of ``arg``, from ``flags``: a bool, or a pytree of bools
    whose structure is ``arg``'s or a prefix of it."""
    try:
        per_subtree = jax.tree_util.tree_map(
            lambda flag, sub: [flag] * len(jax.tree_util.tree_leaves(sub)), flags, arg)
    except ValueError as e:
        raise ValueError(
            f"remat.checkpoint: prevent_cse entry {flags!r} for positional argument "
            f"{position} does not match the argument's structure "
            f"{jax.tree_util.tree_structure(arg)}; give a bool, or a pytree of bools "
            "with the argument's structure (or a prefix of it).") from e
    return jax.tree_util.tree_leaves(per_subtree)


class _Static:
    """A static argument as a cache key: by value when hashable, else by identity."""
    __slots__ = ("value", "_key")

    def __init__(self, value):
        self.value = value
        try:
            hash(value)
            self._key = (True, value)
        except TypeError:
            self._key = (False, id(value))

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        if not isinstance(other, _Static) or self._key[0] != other._key[0]:
            return False
        if self._key[0]:
            return type(self.value) is type(other.value) and self.value == other.value
        return self.value is other.value


def _split_static(fun, static: frozenset[int], static_names: frozenset[str],
                  args, kwargs):
    """``fun`` with its static arguments bound, and the dynamic arguments left."""
    static_kw = sorted(k for k in kwargs if k in static_names)
    if not static and not static_kw:
        return fun, args, kwargs
    for where, value in ([(f"argument {i}", args[i]) for i in sorted(static)] +
                         [(f"argument {k!r}", kwargs[k]) for k in static_kw]):
        if isinstance(value, core.Tracer):
            raise TypeError(
                f"remat.checkpoint: {where} is marked static but is a traced array "
                f"({value.aval.str_short()}); static arguments must be Python values "
                "(remove it from static_argnums/static_argnames, or pass a concrete "
                "value).")
    statics = tuple(_Static(args[i]) for i in sorted(static))
    kw_statics = tuple((k, _Static(kwargs[k])) for k in static_kw)
    dyn_args = tuple(a for i, a in enumerate(args) if i not in static)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_names}
    return _with_statics(fun, static, statics, len(args), kw_statics), dyn_args, dyn_kwargs


@compat.weakref_lru_cache
def _with_statics(fun, static: frozenset[int], statics: tuple[_Static, ...],
                  nargs: int, kw_statics: tuple[tuple[str, _Static], ...]):
    """``fun`` with its static arguments bound; cached so tracing is cached too."""
    def dyn_fun(*dyn_args, **kwargs):
        static_iter, dyn_iter = iter(statics), iter(dyn_args)
        full = [next(static_iter).value if i in static else next(dyn_iter)
                for i in range(nargs)]
        return fun(*full, **kwargs, **{k: v.value for k, v in kw_statics})
    return dyn_fun


@compat.weakref_lru_cache
def _trace(fun, in_tree, in_avals, ref_kinds, dbg):
    """Traces ``fun`` on abstract arguments to ``(jaxpr, consts, out_tree)``.
    ``ref_kinds`` is part of the cache key only: JAX's ref avals compare equal
    whatever their kind, and the kind changes what the recomputation replays."""
    out_tree_cell = []

    def flat_fun(*flat):
        args, kwargs = jax.tree_util.tree_unflatten(in_tree, flat)
        out = fun(*args, **kwargs)
        _check_arguments_kept((args, kwargs), flat, out, dbg)
        _check_outputs(out, dbg)
        flat_out, out_tree = jax.tree_util.tree_flatten(out)
        out_tree_cell.append(out_tree)
        return flat_out

    try:
        jaxpr, consts = compat.trace_flat(flat_fun, list(in_avals), dbg)
    except jax.errors.ConcretizationTypeError as e:
        e.args = (e.args[0] + _CONCRETIZATION_HINT,) + e.args[1:]
        raise
    return jaxpr, consts, out_tree_cell[0]


def changed_argument(given, before, outputs) -> str | None:
    """The path of the first leaf of ``given`` (the arguments, after the function
    ran) that the function set anew and did not return: none of the leaves
    ``before`` it ran, nor of its results ``outputs``; None if there is none.
    Such a change (a Flax NNX variable's update) is lost to a caller that gets
    only the results."""
    kept = {id(x) for x in before} | {id(x) for x in jax.tree_util.tree_leaves(outputs)}
    for path, leaf in jax.tree_util.tree_flatten_with_path(given)[0]:
        if id(leaf) not in kept:
            return jax.tree_util.keystr(path[1:])
    return None


def _check_arguments_kept(given, before, outputs, dbg) -> None:
    path = changed_argument(given, before, outputs)
    if path is not None:
        raise ValueError(
            f"remat.checkpoint: the function {dbg.func_src_info} changed its arguments "
            f"(argument leaf {path}) and did not return the new value: it set a field "
            "or item of a mutable argument anew, such as a Flax NNX variable's value "
            "(an RNG stream's count, batch statistics). Like jax.checkpoint, "
            "remat.checkpoint returns only the function's results, so the change "
            "would be lost. Return the new values instead; for Flax NNX modules, use "
            "remat.nnx.remat, which carries their state in and out.")


def _check_outputs(out, dbg) -> None:
    """Raises a TypeError naming the first output leaf that is not a JAX value."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
        try:
            core.shaped_abstractify(leaf)
        except TypeError:
            where = f" at output {jax.tree_util.keystr(path)}" if path else ""
            raise TypeError(
                f"remat.checkpoint: the function {dbg.func_src_info} returned a value "
                f"of type {type(leaf).__name__}{where} ({leaf!r:.60}), which is not a "
                "valid JAX type. A checkpointed function must return arrays, "
                "scalars, or pytrees of them (None is an empty pytree).") from None

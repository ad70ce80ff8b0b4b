"""What differentiation saves: residuals of a function's VJP and where they come from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from remat._jax import compat
from remat._jax.compat import core, debug_info, name_p, reduce_precision_p, source_info_util


def describe_outputs(jaxpr: core.Jaxpr, arg_names: Sequence[str]
                     ) -> list[tuple[core.AbstractValue, str]]:
    """For each output of ``jaxpr``: its aval and a phrase naming its origin."""
    # A residual rounded by reduce_precision is reported as its producer's output.
    rounded = {e.outvars[0]: e.invars[0] for e in jaxpr.eqns
               if e.primitive is reduce_precision_p}
    producers = {v: e for e in jaxpr.eqns for v in e.outvars}
    consts = set(jaxpr.constvars)
    args = {v: i for i, v in enumerate(jaxpr.invars)}
    described = []
    for out in jaxpr.outvars:
        if isinstance(out, core.Literal):
            described.append((out.aval, "from a literal"))
            continue
        v = rounded.get(out, out)
        if v in consts:
            described.append((out.aval, "from a constant"))
        elif v in args:
            i = args[v]
            name = arg_names[i] if i < len(arg_names) and arg_names[i] else None
            described.append((out.aval, f"from the argument {name}" if name else
                              f"from the argument at flattened index {i}"))
        else:
            eqn = producers[v]
            where = source_info_util.summarize(eqn.source_info)
            if eqn.primitive is name_p:
                described.append((out.aval, f"named '{eqn.params['name']}' from {where}"))
            elif eqn.primitive.name in ("jit", "pjit"):
                described.append((out.aval, f"output of jitted function "
                                  f"'{eqn.params.get('name')}' from {where}"))
            else:
                described.append((out.aval, f"output of {eqn.primitive.name} from {where}"))
    return described


def saved_residuals(fun: Callable, *args: Any, **kwargs: Any
                    ) -> list[tuple[core.AbstractValue, str]]:
    """The values ``jax.vjp(fun, *args, **kwargs)`` keeps for the backward pass.

    Returns a list of ``(aval, description)``; the description names the origin:
    an argument (by name or path), a named value, or a primitive and source line.

    >>> import jax.numpy as jnp, remat
    >>> f = remat.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
    >>> [src for _, src in remat.saved_residuals(f, jnp.ones(3))]
    ['from the argument x']
    """
    flat_args, in_tree = jax.tree_util.tree_flatten((args, kwargs))

    def flat_fun(*flat):
        a, k = jax.tree_util.tree_unflatten(in_tree, flat)
        return fun(*a, **k)

    # A ref handed to a custom_vjp's backward rule is itself a residual.
    with compat.mutable_array_checks(False):
        closed, out_shape = jax.make_jaxpr(lambda *xs: jax.vjp(flat_fun, *xs),
                                           return_shape=True)(*flat_args)
    num_res = len(jax.tree_util.tree_leaves(out_shape[1]))
    jaxpr = closed.jaxpr
    res_jaxpr = jaxpr.replace(outvars=jaxpr.outvars[len(jaxpr.outvars) - num_res:])
    names = debug_info("saved_residuals", fun, args, kwargs).arg_names
    return describe_outputs(res_jaxpr, names or ())


def print_saved_residuals(fun: Callable, *args: Any, **kwargs: Any) -> None:
    """Prints :func:`saved_residuals`, one residual a line.

    >>> import jax.numpy as jnp, remat
    >>> remat.print_saved_residuals(remat.checkpoint(jnp.sin), jnp.ones(3))
    f32[3] from the argument x
    """
    for aval, src in saved_residuals(fun, *args, **kwargs):
        print(f"{aval.str_short(short_dtypes=True)} {src}")

"""Open ``shard_map`` equations for planning: one ``shard_map`` per piece of its body.

A ``shard_map`` is one equation whose body runs on every device with per-device
shapes; a differentiated program holds a forward one that returns every residual
and a backward one that takes them all, so, as one op each, nothing between them
can be recomputed. :func:`split_shard_maps` cuts each body into pieces (as small as
single equations) and gives each piece its own ``shard_map`` over the same mesh;
a value that crosses a cut leaves one piece and enters the next laid out so that
every device gets its own value back:

* a value that varies over manual axes (its aval's ``manual_axis_type.varying``,
  printed ``{V:...}``; every manual axis when the
  ``shard_map`` does not check them) is concatenated along its first dimension
  over exactly those axes: out and in spec ``P((axes...),)``;
* a value that varies over none is replicated: spec ``P()``;
* a result of the original ``shard_map`` keeps its own out spec.

Nothing moves between devices at a cut: each device's shard is its own value. The
pieces hold the original equations, collectives included, so the program
communicates exactly what it did. A scalar that varies over a manual axis cannot
cross a cut (it has no dimension to concatenate along), so the body is never cut
while one is live; a ``shard_map`` whose results are its own inputs or literals, that
returns a result twice, or whose axes are only partly manual, is left whole.
"""

from __future__ import annotations

from jax.sharding import PartitionSpec as P

from remat._jax.compat import core, region_debug_info

__all__ = ["split_shard_maps"]


def split_shard_maps(closed: core.ClosedJaxpr) -> core.ClosedJaxpr:
    """``closed`` with each top-level ``shard_map`` equation split into pieces
    (see the module docstring); the same program otherwise.

    >>> import os, jax, jax.numpy as jnp
    >>> mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    >>> f = jax.shard_map(lambda x: jnp.sin(jnp.cos(x)), mesh=mesh,
    ...                   in_specs=jax.P("i"), out_specs=jax.P("i"))
    >>> split = split_shard_maps(jax.make_jaxpr(f)(jnp.ones(4)))
    >>> [e.primitive.name for e in split.jaxpr.eqns]
    ['shard_map', 'shard_map']
    """
    eqns = []
    changed = False
    for eqn in closed.jaxpr.eqns:
        pieces = _split(eqn) if eqn.primitive.name == "shard_map" else None
        if pieces is None:
            eqns.append(eqn)
        else:
            eqns.extend(pieces)
            changed = True
    if not changed:
        return closed
    return core.ClosedJaxpr(closed.jaxpr.replace(eqns=eqns), closed.consts)


def _split(eqn: core.JaxprEqn) -> list[core.JaxprEqn] | None:
    params = eqn.params
    body = params["jaxpr"]
    body = getattr(body, "jaxpr", body)
    mesh = params["mesh"]
    manual = params.get("manual_axes", params.get("newly_manual_axes"))
    if (len(body.eqns) < 2 or body.constvars or manual is None or
            set(manual) != set(mesh.axis_names) or
            len(set(body.outvars)) != len(body.outvars) or
            any(not isinstance(v, core.Var) or v in body.invars for v in body.outvars)):
        return None
    order = [a for a in mesh.axis_names if a in manual]
    sizes = dict(mesh.shape)
    check = params.get("check_vma", params.get("check_rep", True))

    def spec_of(v) -> P | None:
        axes = tuple(a for a in order if a in _varying(v.aval)) if check else tuple(order)
        if not axes:
            return P()
        if not getattr(v.aval, "shape", ()):
            return None          # a varying scalar: nothing to concatenate along
        return P(axes)

    out_spec = {v: s for v, s in zip(body.outvars, params["out_specs"])}
    last_use: dict = {}
    for i, e in enumerate(body.eqns):
        for a in e.invars:
            if isinstance(a, core.Var):
                last_use[a] = i
    for v in body.outvars:
        last_use[v] = len(body.eqns)

    # Cut after equation i where every value defined so far and read later
    # can cross (those of earlier pieces crossed a cut already).
    groups, current = [], []
    for i, e in enumerate(body.eqns):
        current.append(e)
        live = [v for g in current for v in g.outvars
                if isinstance(v, core.Var) and last_use.get(v, -1) > i]
        if i == len(body.eqns) - 1 or all(v in out_spec or spec_of(v) is not None
                                          for v in live):
            groups.append(current)
            current = []

    if len(groups) < 2:
        return None
    # Where each body value lives outside, and how it is laid out there.
    outer = {v: (o, s) for v, o, s in zip(body.invars, eqn.invars, params["in_specs"])}
    result_var = dict(zip(body.outvars, eqn.outvars))
    pieces = []
    for n, group in enumerate(groups):
        defined = {v for e in group for v in e.outvars if isinstance(v, core.Var)}
        end = sum(len(g) for g in groups[:n + 1]) - 1
        ins: list = []
        for e in group:
            for a in e.invars:
                if isinstance(a, core.Var) and a not in defined and a not in ins:
                    ins.append(a)
        outs = [v for v in defined if last_use.get(v, -1) > end or v in out_spec]
        outs.sort(key=lambda v: _position(group, v))
        out_specs, out_vars = [], []
        for v in outs:
            spec = out_spec[v] if v in out_spec else spec_of(v)
            outside = result_var.get(v)
            if outside is None or isinstance(outside, core.DropVar):
                outside = core.Var(_global_aval(v.aval, spec, sizes))
            outer[v] = (outside, spec)
            out_specs.append(spec)
            out_vars.append(outside)
        rename = {v: core.Var(v.aval) for v in ins}
        new_eqns = []
        for e in group:
            invars = [rename.get(a, a) if isinstance(a, core.Var) else a for a in e.invars]
            outvars = []
            for v in e.outvars:
                if isinstance(v, core.Var) and not isinstance(v, core.DropVar):
                    rename[v] = core.Var(v.aval)
                    outvars.append(rename[v])
                else:
                    outvars.append(v)
            new_eqns.append(e.replace(invars=invars, outvars=outvars))
        piece_body = core.Jaxpr([], [rename[v] for v in ins], [rename[v] for v in outs],
                                new_eqns,
                                effects=core.join_effects(*(e.effects for e in new_eqns)),
                                debug_info=region_debug_info())
        new_params = dict(params, jaxpr=piece_body,
                          in_specs=tuple(outer[v][1] for v in ins),
                          out_specs=tuple(out_specs))
        pieces.append(core.new_jaxpr_eqn([outer[v][0] for v in ins], out_vars,
                                         eqn.primitive, new_params, piece_body.effects,
                                         eqn.source_info))
    return pieces


def _varying(aval) -> frozenset:
    """The manual axes a value varies over (``{V:data}`` in a printed jaxpr)."""
    axis_type = getattr(aval, "manual_axis_type", None)
    if axis_type is not None:
        return frozenset(getattr(axis_type, "varying", ()))
    return frozenset(getattr(aval, "vma", ()))


def _position(group, v) -> tuple[int, int]:
    for i, e in enumerate(group):
        if v in e.outvars:
            return i, e.outvars.index(v)
    return len(group), 0


def _global_aval(aval, spec: P, sizes) -> core.ShapedArray:
    """The outer aval of a value laid out by ``spec`` (axes on its first dimension)."""
    shape = tuple(aval.shape)
    if spec and spec[0] is not None:
        axes = spec[0] if isinstance(spec[0], tuple) else (spec[0],)
        factor = 1
        for a in axes:
            factor *= sizes[a]
        shape = (shape[0] * factor,) + shape[1:]
    return core.ShapedArray(shape, aval.dtype)

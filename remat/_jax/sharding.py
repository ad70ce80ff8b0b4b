"""Per-device sizes of the values of an SPMD program.

A jaxpr's shapes are global; XLA partitions the program and every device holds a
shard of each value, and ``compile().memory_analysis()`` of a partitioned program
reports one device's bytes. The planning graph must size values the same way, so
this module works out, for every value of a flat jaxpr, which mesh axes split each
of its dimensions (its *layout*: one tuple of axis names per dimension), and from
that the bytes one device holds: ``ceil(dim / product of its axes' sizes)`` per
dimension, times the item size.

Where the layouts come from, in order of trust:

1. the value's own aval, when it carries a sharding that names mesh axes
   (explicit-sharding meshes, ``jax.sharding.AxisType.Explicit``);
2. the program's inputs: the ``in_shardings`` given to ``jax.jit``, else the
   arguments' own ``.sharding``;
3. ``with_sharding_constraint`` (``sharding_constraint``), ``reshard`` and
   ``device_put`` equations: their target sharding; ``shard_map``'s outputs: its
   ``out_specs`` (the body's own values have per-device shapes already);
4. propagation through the other equations, as XLA's sharding propagation mostly
   does: ``dot_general`` (batch, then the left operand's free dimensions, then the
   right's; a contracted dimension's axes are reduced away), ``transpose``,
   ``broadcast_in_dim``, reductions, ``reshape`` (axes stay on the major dimension of
   each group of merged or split dimensions, when they divide it), ``squeeze``;
   any other equation takes, for each output, the operand of the same rank most
   like it, keeping the axes of the dimensions whose sizes match (elementwise ops,
   slices, pads, concatenations, updates...); among several, the most split one.

Fallback: a value with no layout from any of these is taken as replicated, its
global bytes on every device. That is an upper bound (never too small), and the
automatic pass checks every plan against XLA's own per-device figure anyway. An
axis never splits two dimensions of one value: a repeat is dropped.

Example::

    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda x, w: jnp.tanh(x @ w))(
    ...     jnp.ones((8, 4)), jnp.ones((4, 6)))
    >>> sizes = per_device_bytes(closed.jaxpr, [(("data",), ()), ((), ("model",))],
    ...                          {"data": 4, "model": 2})
    >>> [sizes[e.outvars[0]] for e in closed.jaxpr.eqns]   # f32[8,6] over 4 x 2
    [24, 24]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from .compat_graph import Jaxpr, Literal, Var

__all__ = ["Layout", "per_device_bytes", "input_layouts", "program_sizes",
           "keep_output_shardings", "value_layouts", "value_shardings"]

#: For each dimension of a value, the mesh axes that split it (major first).
Layout = tuple[tuple[str, ...], ...]

_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                         "reduce_and", "reduce_or", "reduce_xor", "argmax", "argmin"})


def program_sizes(jaxpr: Jaxpr, args: Sequence[Any], kwargs: Mapping[str, Any],
                  jit_kwargs: Mapping[str, Any]) -> dict[Var, int]:
    """Per-device bytes of the values of ``jaxpr``, the flat program of
    ``fun(*args, **kwargs)`` compiled with ``jax.jit(fun, **jit_kwargs)``; empty
    for a program whose inputs and equations name no mesh axes (one device)."""
    layouts, axis_sizes = input_layouts(args, kwargs, jit_kwargs)
    if len(layouts) != len(jaxpr.invars):
        raise ValueError(f"remat internal error: {len(layouts)} input shardings for a "
                         f"program of {len(jaxpr.invars)} inputs.")
    return per_device_bytes(jaxpr, layouts, axis_sizes)


def input_layouts(args: Sequence[Any], kwargs: Mapping[str, Any],
                  jit_kwargs: Mapping[str, Any]) -> tuple[list[Layout | None], dict]:
    """The layout of each flat input of ``(args, kwargs)``: from ``in_shardings``
    where given (a sharding or ``None`` per positional argument, as ``jax.jit``
    takes it: a prefix of the arguments' structure), else the argument's own
    ``.sharding``; and the sizes of the mesh axes they name."""
    leaves = jax.tree_util.tree_leaves((args, kwargs))
    given: list[Any] = [None] * len(leaves)
    if jit_kwargs.get("in_shardings") is not None:
        shardings = jit_kwargs["in_shardings"]
        if isinstance(shardings, Sharding) or not isinstance(shardings, (tuple, list)):
            shardings = (shardings,) * len(args)
        is_spec = lambda s: s is None or isinstance(s, Sharding)
        full = jax.tree.broadcast(tuple(shardings), tuple(args), is_leaf=is_spec)
        flat_given = jax.tree_util.tree_leaves(full, is_leaf=is_spec)
        given[:len(flat_given)] = flat_given
    axis_sizes: dict[str, int] = {}
    layouts: list[Layout | None] = []
    for leaf, sharding in zip(leaves, given):
        sharding = sharding if sharding is not None else getattr(leaf, "sharding", None)
        shape = tuple(getattr(leaf, "shape", ()))
        layouts.append(layout_of_sharding(sharding, shape, axis_sizes)
                       if isinstance(sharding, Sharding) else None)
    return layouts, axis_sizes


def layout_of_sharding(sharding: Sharding, shape: tuple[int, ...],
                       axis_sizes: dict[str, int]) -> Layout | None:
    """The layout a sharding gives a value of ``shape`` (recording the sizes of
    the axes it names in ``axis_sizes``). A sharding that is not a
    ``NamedSharding`` gets one made-up axis per split dimension, sized by how
    many pieces ``shard_shape`` cuts it into."""
    if isinstance(sharding, NamedSharding):
        sizes = dict(sharding.mesh.shape)
        return _layout_of_spec(sharding.spec, len(shape), sizes, axis_sizes)
    try:
        local = sharding.shard_shape(shape)
    except Exception:   # noqa: BLE001 - a sharding that cannot say: no layout
        return None
    layout = []
    for d, (g, l) in enumerate(zip(shape, local)):
        pieces = -(-g // l) if l else 1
        if pieces > 1:
            name = f"{type(sharding).__name__}:{d}/{pieces}"
            axis_sizes[name] = pieces
            layout.append((name,))
        else:
            layout.append(())
    return tuple(layout)


def _layout_of_spec(spec: PartitionSpec, rank: int, mesh_sizes: Mapping[str, int],
                    axis_sizes: dict[str, int]) -> Layout:
    layout: list[tuple[str, ...]] = []
    for d in range(rank):
        entry = spec[d] if d < len(spec) else None
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(
            entry)
        names = tuple(n for n in names if isinstance(n, str) and n in mesh_sizes)
        for n in names:
            axis_sizes[n] = int(mesh_sizes[n])
        layout.append(names)
    return _dedupe(tuple(layout))


def per_device_bytes(jaxpr: Jaxpr, in_layouts: Sequence[Layout | None],
                     axis_sizes: dict[str, int]) -> dict[Var, int]:
    """Per-device bytes of each value of ``jaxpr`` (inputs, then each equation's
    results) that some mesh axis splits; values not in the result are whole on
    every device. ``axis_sizes`` gives the mesh axes' sizes (it grows with the
    axes the equations name)."""
    sizes: dict[Var, int] = {}
    for var, layout in value_layouts(jaxpr, in_layouts, axis_sizes).items():
        if any(layout):
            sizes[var] = local_nbytes(var.aval, layout, axis_sizes)
    return sizes


def value_layouts(jaxpr: Jaxpr, in_layouts: Sequence[Layout | None],
                  axis_sizes: dict[str, int]) -> dict[Var, Layout]:
    """The layout of each value of ``jaxpr`` that one is worked out for (see the
    module docstring)."""
    layouts: dict[Var, Layout] = {}
    for var, layout in zip(jaxpr.invars, in_layouts):
        own = _aval_layout(var.aval, axis_sizes)
        chosen = own if own is not None else layout
        if chosen is not None:
            layouts[var] = chosen
    for eqn in jaxpr.eqns:
        ins = [None if isinstance(a, Literal) else layouts.get(a) for a in eqn.invars]
        outs = _propagate(eqn, ins, axis_sizes)
        for var, layout in zip(eqn.outvars, outs):
            own = _aval_layout(var.aval, axis_sizes)
            chosen = own if own is not None else layout
            if chosen is not None and isinstance(var, Var):
                layouts[var] = chosen
    _propagate_back(jaxpr, layouts, axis_sizes)
    return layouts


def value_shardings(jaxpr: Jaxpr, specs: Sequence[Any]) -> dict[Var, NamedSharding]:
    """The sharding of each value of ``jaxpr`` (a flat program over ``specs``,
    its inputs) that a mesh axis splits, over the one mesh of the inputs'
    shardings; empty for a program on one device. A recomputing region's
    results are annotated with theirs (``rewrite.py``): XLA's partitioner
    cannot see through the region's conditional and would make them whole."""
    meshes = {s.mesh for s in (getattr(x, "sharding", None) for x in specs)
              if isinstance(s, NamedSharding)}
    if len(meshes) != 1:
        return {}
    (mesh,) = meshes
    if mesh.size < 2:
        return {}
    layouts, axis_sizes = input_layouts(specs, {}, {})
    shardings = {}
    for var, layout in value_layouts(jaxpr, layouts, axis_sizes).items():
        if any(layout) and all(a in mesh.axis_names for axes in layout for a in axes):
            spec = PartitionSpec(*(axes[0] if len(axes) == 1 else (axes or None)
                                   for axes in layout))
            shardings[var] = NamedSharding(mesh, spec)
    return shardings


def local_nbytes(aval: Any, layout: Layout, axis_sizes: Mapping[str, int]) -> int:
    """Bytes of one device's shard of a value of ``aval`` laid out as ``layout``.

    >>> import jax.numpy as jnp
    >>> from jax.core import ShapedArray
    >>> local_nbytes(ShapedArray((10, 6), jnp.float32), (("a",), ()), {"a": 4})
    72
    """
    dims = [-(-d // math.prod(axis_sizes[n] for n in names))
            for d, names in zip(aval.shape, layout)]
    return math.prod(dims) * aval.dtype.itemsize


def keep_output_shardings(compiled: Any, jit_kwargs: Mapping[str, Any]) -> dict:
    """``jit_kwargs`` with ``out_shardings`` set to the output shardings of
    ``compiled`` (the plain program), unless given or the program runs on one
    device: a rewritten program then returns its results laid out as the plain
    one does, whatever XLA's propagation would choose for it."""
    if jit_kwargs.get("out_shardings") is not None:
        return dict(jit_kwargs)
    shardings = compiled.output_shardings
    leaves = jax.tree_util.tree_leaves(shardings)
    if not any(len(s.device_set) > 1 for s in leaves):
        return dict(jit_kwargs)
    return {**jit_kwargs, "out_shardings": shardings}


# ------------------------------------------------------------------ propagation

def _aval_layout(aval: Any, axis_sizes: dict[str, int]) -> Layout | None:
    """The layout an aval carries (explicit-sharding meshes), or None."""
    sharding = getattr(aval, "sharding", None)
    shape = getattr(aval, "shape", None)
    if not isinstance(sharding, NamedSharding) or shape is None:
        return None
    if not any(entry is not None for entry in sharding.spec):
        return None
    return _layout_of_spec(sharding.spec, len(shape), dict(sharding.mesh.shape),
                           axis_sizes)


def _propagate(eqn, ins: list[Layout | None], axis_sizes: dict[str, int]
               ) -> list[Layout | None]:
    name = eqn.primitive.name
    params = eqn.params
    shapes = [tuple(getattr(a.aval, "shape", ())) for a in eqn.invars]
    out_shapes = [tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars]
    if name == "sharding_constraint":
        return [_from_sharding(params["sharding"], out_shapes[0], axis_sizes)]
    if name == "reshard":
        return [_from_sharding(params["dst_sharding"], out_shapes[0], axis_sizes)]
    if name == "device_put":
        targets = params.get("devices") or [None] * len(out_shapes)
        return [_from_sharding(t, s, axis_sizes) if isinstance(t, Sharding) else l
                for t, s, l in zip(targets, out_shapes, ins)]
    if name == "shard_map":
        sizes = dict(params["mesh"].shape)
        return [_layout_of_spec(spec, len(s), sizes, axis_sizes)
                for spec, s in zip(params["out_specs"], out_shapes)]
    if not any(ins):
        return [None] * len(out_shapes)
    if name == "dot_general":
        return [_dot_layout(params["dimension_numbers"], shapes, ins)]
    if name == "transpose":
        if ins[0] is None:
            return [None]
        return [tuple(ins[0][p] for p in params["permutation"])]
    if name == "broadcast_in_dim":
        if ins[0] is None:
            return [None]
        layout = [()] * len(out_shapes[0])
        for i, d in enumerate(params["broadcast_dimensions"]):
            if shapes[0][i] == out_shapes[0][d]:
                layout[d] = ins[0][i]
        return [_dedupe(tuple(layout))]
    if name in _REDUCTIONS and ins[0] is not None:
        axes = set(params["axes"])
        return [tuple(n for d, n in enumerate(ins[0]) if d not in axes)]
    if name == "squeeze" and ins[0] is not None:
        dims = {d % max(len(shapes[0]), 1) for d in params["dimensions"]}
        return [tuple(n for d, n in enumerate(ins[0]) if d not in dims)]
    if name == "reshape" and ins[0] is not None:
        return [_reshape_layout(shapes[0], out_shapes[0], ins[0], axis_sizes)]
    return [_like_operand(s, shapes, ins, axis_sizes) for s in out_shapes]


def _propagate_back(jaxpr: Jaxpr, layouts: dict[Var, Layout],
                    axis_sizes: Mapping[str, int]) -> None:
    """Gives a computed value with no layout the layout of a result of the same
    shape that an equation computes from it (a broadcast constant added to a split
    activation is split like it), latest equations first, as XLA's propagation
    also runs from users to operands."""
    inputs = set(jaxpr.invars)
    for eqn in reversed(jaxpr.eqns):
        known = [(v.aval.shape, layouts[v]) for v in eqn.outvars
                 if isinstance(v, Var) and v in layouts and hasattr(v.aval, "shape")]
        if not known:
            continue
        for a in eqn.invars:
            if isinstance(a, Literal) or a in layouts or a in inputs:
                continue
            shape = getattr(a.aval, "shape", None)
            match = next((layout for s, layout in known if s == shape), None)
            if match is not None:
                layouts[a] = match


def _from_sharding(sharding: Any, shape: tuple[int, ...], axis_sizes: dict[str, int]
                   ) -> Layout | None:
    if isinstance(sharding, Sharding):
        return layout_of_sharding(sharding, shape, axis_sizes)
    return None


def _dot_layout(dimension_numbers, shapes, ins) -> Layout | None:
    (lc, rc), (lb, rb) = dimension_numbers
    lhs = ins[0] or tuple(() for _ in shapes[0])
    rhs = ins[1] or tuple(() for _ in shapes[1])
    batch = [lhs[l] or rhs[r] for l, r in zip(lb, rb)]
    free_l = [lhs[d] for d in range(len(shapes[0])) if d not in lc and d not in lb]
    free_r = [rhs[d] for d in range(len(shapes[1])) if d not in rc and d not in rb]
    return _dedupe(tuple(batch + free_l + free_r))


def _reshape_layout(old: tuple[int, ...], new: tuple[int, ...], layout: Layout,
                    axis_sizes: Mapping[str, int]) -> Layout:
    """Axes move with the major dimension of each group of dimensions that a
    reshape merges or splits, when they divide the new major dimension."""
    out: list[tuple[str, ...]] = [()] * len(new)
    i = j = 0
    while i < len(old) and j < len(new):
        gi, gj = [i], [j]
        a, b = old[i], new[j]
        while a != b:
            if a < b and gi[-1] + 1 < len(old):
                gi.append(gi[-1] + 1)
                a *= old[gi[-1]]
            elif b < a and gj[-1] + 1 < len(new):
                gj.append(gj[-1] + 1)
                b *= new[gj[-1]]
            else:
                return tuple(out)   # shapes that do not factor alike: replicated
        major = next((layout[d] for d in gi if old[d] > 1), ())
        target = next((d for d in gj if new[d] > 1), gj[0])
        pieces = math.prod(axis_sizes[n] for n in major)
        if major and new[target] % pieces == 0:
            out[target] = major
        i, j = gi[-1] + 1, gj[-1] + 1
    return tuple(out)


def _like_operand(shape: tuple[int, ...], shapes, ins, axis_sizes) -> Layout | None:
    """The fallback rule: from the operands of the same rank, the axes of the
    dimensions whose sizes match; the most split such layout."""
    best, best_pieces = None, 1
    for s, layout in zip(shapes, ins):
        if layout is None or len(s) != len(shape):
            continue
        kept = _dedupe(tuple(n if a == b else () for n, a, b in zip(layout, s, shape)))
        pieces = math.prod(axis_sizes[n] for names in kept for n in names)
        if pieces > best_pieces:
            best, best_pieces = kept, pieces
    return best


def _dedupe(layout: Layout) -> Layout:
    """Drops a mesh axis from every dimension after the first that names it."""
    seen: set[str] = set()
    out = []
    for names in layout:
        kept = tuple(n for n in names if n not in seen)
        seen.update(kept)
        out.append(kept)
    return tuple(out)

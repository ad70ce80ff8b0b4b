"""The program the automatic pass plans: how a call is traced, flattened, compiled.

A call ``fun(*args, **kwargs)`` is split as ``jax.jit`` splits it, plus what
``equinox.filter_jit`` adds: arguments named by ``static_argnums`` /
``static_argnames`` are static (hashed, baked into the trace), and inside the other
arguments every leaf that is not an array (a function, a string, None, an
object), and a Python number inside an Equinox module, is static too. What
remains, the arrays and other Python numbers, are the program's dynamic inputs,
in a fixed order (:class:`CallSplit`).

The pipeline: trace (``jax.make_jaxpr`` of the dynamic inputs) -> flatten
(``inline.inline_calls``) -> planning graph (``to_graph.jaxpr_to_graph``); then,
for each plan, rewrite (``rewrite.rewrite_jaxpr``) -> compile (:meth:`Program.compile`).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import inspect
import itertools
import math
import sys
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from remat._jax.checkpoint import changed_argument
from remat._jax.compat import core, traced_as
from remat._jax.inline import has_regions, inline_calls
from remat._jax.shard_map_split import split_shard_maps
from remat._jax.sharding import program_sizes
from remat._jax.to_graph import jaxpr_to_graph
from remat.core.graph import Graph

__all__ = ["CallSpec", "CallSplit", "OutputTree", "Program", "trace_program", "is_dynamic"]

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
            items = {value} if isinstance(value, kind) else set(value)
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

        avals = tuple((core.shaped_abstractify(x), _placement(x)) for x in dynamic)
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


@dataclasses.dataclass
class Program:
    """A traced, flattened program and what it needs to be compiled.

    Attributes:
      flat: the flattened program (no nested calls); its inputs are the call's
        dynamic leaves.
      graph: its planning graph (op ``i`` is equation ``i`` of ``flat``).
      out_tree: the structure of its results (an :class:`OutputTree`).
      specs: the abstract dynamic inputs (shapes, dtypes, shardings) it is
        compiled for; no array of the call is kept.
      donated: positions of donated inputs.
      jit_kwargs: the other arguments of ``jax.jit`` to compile with (the plain
        program's output shardings added on a multi-device program, so that
        every plan returns its results laid out as the plain program does).
      key: hashable: the program's structure, constants and call (equal keys,
        the same compiled programs).
      in_shardings: per input, the sharding ``in_shardings`` gave it, or None.
      as_written: the program as traced, where flattening dissolved checkpoint
        regions of the user's (``flat`` is then the program without them); None
        where ``flat`` computes what it does.
    """
    flat: core.ClosedJaxpr
    graph: Graph
    out_tree: Any
    specs: tuple
    donated: tuple[int, ...]
    jit_kwargs: dict
    key: Any
    in_shardings: tuple = ()
    as_written: core.ClosedJaxpr | None = None
    # (jit_kwargs, jax.jit's trace of flat): see lower
    _template: Any = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def rewritten(self, closed: core.ClosedJaxpr, tag: Any) -> "Program":
        """This program with ``closed`` (a rewrite of ``flat`` with the same inputs
        and outputs) as its flat program; ``tag`` names the rewrite in the key."""
        return dataclasses.replace(self, flat=closed, graph=_graph_of(
                                       closed, self.specs, self.in_shardings, self.donated),
                                   key=(self.key, tag), as_written=None)

    def held_bytes(self) -> tuple[int, int, int]:
        """Bytes of its dynamic inputs, of its outputs, and of the outputs that
        can reuse a donated input's buffer (one of the same shape and type), on
        one device: what XLA's arguments, outputs and aliased bytes come to
        when the inputs are not split over devices."""
        def nbytes(aval) -> int:
            return math.prod(aval.shape) * aval.dtype.itemsize
        donated = collections.Counter((s.shape, s.dtype) for k, s in enumerate(self.specs)
                                      if k in self.donated)
        alias = 0
        for v in self.flat.jaxpr.outvars:
            kind = (v.aval.shape, v.aval.dtype)
            if donated[kind] > 0:
                donated[kind] -= 1
                alias += nbytes(v.aval)
        return (sum(map(nbytes, self.specs)),
                sum(nbytes(v.aval) for v in self.flat.jaxpr.outvars), alias)

    def function(self, closed: core.ClosedJaxpr) -> Callable:
        """``closed`` (a rewrite of ``flat``) as a jitted function of the dynamic
        leaves, returning the original output structure."""
        def run(*dynamic):
            return self.out_tree.placeholder(core.jaxpr_as_fun(closed)(*dynamic))
        placed = ({"in_shardings": self.in_shardings}
                  if any(s is not None for s in self.in_shardings) else {})
        return jax.jit(run, donate_argnums=self.donated, **placed, **self.jit_kwargs)

    def lower(self, closed: core.ClosedJaxpr):
        """``closed`` lowered for the program's abstract inputs: through a trace of
        ``flat`` made once (per ``jit_kwargs``) where ``closed`` takes and returns
        what ``flat`` does (:func:`~remat._jax.compat.traced_as`), else traced."""
        if self._template is None or self._template[0] is not self.jit_kwargs:
            self._template = (self.jit_kwargs,
                              self.function(self.flat).trace(*self.specs))
        traced = traced_as(self._template[1], closed)
        if traced is None:
            return self.function(closed).lower(*self.specs)
        return traced.lower()

    def compile(self, closed: core.ClosedJaxpr, measure_only: bool = False):
        """``closed`` compiled for the call's dynamic leaves; with ``measure_only``,
        faster where the platform allows (:data:`MEASURE_OPTIONS`): nearly the
        same memory figures, slower code (compile again to run it)."""
        return self.compile_lowered(self.lower(closed), measure_only)

    def compile_lowered(self, lowered, measure_only: bool = False):
        """:meth:`compile` of what :meth:`lower` returned (a plan measured, then
        compiled to run, is lowered once)."""
        if measure_only and self.measures_in_part:
            return lowered.compile(compiler_options=MEASURE_OPTIONS[self.platform()])
        return lowered.compile()

    @property
    def measures_in_part(self) -> bool:
        """Whether a ``measure_only`` compile skips work on this platform (and its
        program must be compiled again to run at full speed)."""
        return self.platform() in MEASURE_OPTIONS

    def platform(self) -> str:
        """The platform the program runs on (its inputs' devices, else the default)."""
        for sharding in self.in_shardings:
            if sharding is not None and getattr(sharding, "device_set", None):
                return next(iter(sharding.device_set)).platform
        return jax.default_backend()


#: Compiler options, per platform, for a compile that only measures a plan. On CPU:
#: no LLVM optimization, kernels from the older emitters instead of the MLIR
#: fusion emitters, whose pipeline is most of a CPU compile (on programs of a few
#: dozen fusions or more; on a handful of matmuls the older emitters compile
#: slower), and one LLVM module, not split for threads (at O0 the split costs more
#: than it saves: 10-25% faster, on one core). XLA assigns buffers before code
#: generation, but the emitter choice
#: also steers a few HLO passes (fusion, scatter expansion), so a plan's figures
#: may differ from its full compile's by kilobytes. Rule: a measured figure only
#: ranks plans; the plan that answers is compiled in full, its full figure
#: replaces the measured one, and if that is over the limit the search goes on
#: (``Planner.answer``).
MEASURE_OPTIONS = {"cpu": {"xla_backend_optimization_level": 0,
                           "xla_cpu_use_fusion_emitters": False,
                           "xla_cpu_parallel_codegen_split_count": 1}}


def trace_program(fun: Callable, args: tuple, kwargs: dict, spec: CallSpec,
                  jit_kwargs: dict) -> tuple[Program, CallSplit]:
    """Traces ``fun(*args, **kwargs)``, flattens it and builds its planning graph;
    the program, and the call split as it was traced."""
    split = CallSplit.of(args, kwargs, spec)
    traced_out: list[OutputTree] = []

    def flat_fun(*dynamic):
        a, k = split.rebuild(dynamic)
        before = jax.tree_util.tree_leaves((a, k))
        out = fun(*a, **k)
        path = changed_argument((a, k), before, out)
        if path is not None:
            raise ValueError(
                f"remat.jit: the function changed its arguments (argument leaf {path}) "
                "and did not return the new value: it set a field or item of a "
                "mutable argument anew, such as a Flax NNX variable's "
                "value (an optimizer step, an RNG stream's count). Like jax.jit, "
                "remat.jit returns only the function's results, so the change would "
                "be lost. Return the new state: for Flax NNX, split the objects into "
                "graph and state (nnx.split) before the call, merge them inside, and "
                "return nnx.state(...) (README, \"Flax NNX\").")
        tree, leaves = OutputTree.of(out)
        traced_out.append(tree)
        return leaves

    closed = jax.make_jaxpr(flat_fun)(*split.dynamic)
    flat = split_shard_maps(inline_calls(closed))
    graph = _graph_of(flat, split.dynamic, split.shardings, split.donated)
    as_written = closed if has_regions(closed.jaxpr) else None
    key = (str(flat.jaxpr), _digest(flat.consts), split.key,
           tuple(sorted((k, repr(v)) for k, v in jit_kwargs.items())),
           jax.default_backend(), as_written and str(as_written.jaxpr))
    program = Program(flat, graph, traced_out[-1],
                      tuple(_spec(x, s) for x, s in zip(split.dynamic, split.shardings)),
                      split.donated, dict(jit_kwargs), key, split.shardings, as_written)
    return program, split


def _graph_of(flat: core.ClosedJaxpr, inputs: tuple, shardings: tuple,
              donated: tuple[int, ...] = ()) -> Graph:
    """The planning graph of ``flat`` (op ``i`` is equation ``i``), its values
    sized by the shard one device holds, from the ``inputs``' shardings (or
    ``shardings``, where given) on; ``donated``: positions of donated inputs."""
    graph = jaxpr_to_graph(flat, donated=[i in donated for i in range(len(inputs))],
                           value_bytes=program_sizes(flat.jaxpr, inputs, {},
                                                     {"in_shardings": shardings}))
    if [op.label for op in graph.ops] != [e.primitive.name for e in flat.jaxpr.eqns]:
        raise AssertionError("remat internal error: the planning graph does not match "
                             "the flattened program equation for equation.")
    return graph


def _spec(x, given=None) -> jax.ShapeDtypeStruct:
    """The abstract value a dynamic input is compiled for (the sharding given, or
    its own if it spans several devices, as ``jax.jit`` places single-device
    inputs itself)."""
    aval = core.shaped_abstractify(x)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=_placement(x, given),
                                weak_type=aval.weak_type)


def _placement(x, given=None):
    """The sharding an input is compiled for: the one given, or its own if it
    spans several devices; None for one device (a Python number's too)."""
    sharding = given if given is not None else getattr(x, "sharding", None)
    return sharding if sharding is not None and len(sharding.device_set) > 1 else None


def _digest(consts) -> str:
    """A digest of the program's constants: programs that differ only in a
    constant's value compile to different programs."""
    h = hashlib.blake2b(digest_size=16)
    for c in consts:
        dtype = getattr(c, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            h.update(repr(dtype).encode())      # (a typed key: its bits, by impl)
            c = jax.random.key_data(c)
        a = np.asarray(c)
        h.update(repr((a.shape, a.dtype)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()

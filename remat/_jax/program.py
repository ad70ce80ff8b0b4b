"""The program the automatic pass plans: how a call is traced, flattened, compiled.

A call is split into its static parts and its dynamic inputs as ``jax.jit``
splits it (:mod:`remat._jax.call`). The pipeline: trace (``jax.make_jaxpr`` of
the dynamic inputs) -> flatten (``inline.inline_calls``) -> planning graph
(``to_graph.jaxpr_to_graph``); then, for each plan, rewrite
(``rewrite.rewrite_jaxpr``) -> compile (:meth:`Program.compile`).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from remat._jax.call import CallSpec, CallSplit, OutputTree, placement
from remat._jax.checkpoint import changed_argument
from remat._jax.compat import core, traced_as
from remat._jax.inline import has_regions, inline_calls
from remat._jax.shard_map_split import split_shard_maps
from remat._jax.sharding import program_sizes
from remat._jax.to_graph import jaxpr_to_graph
from remat.core.graph import Graph

__all__ = ["Program", "trace_program", "MEASURE_OPTIONS"]


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
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=placement(x, given),
                                weak_type=aval.weak_type)


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

"""Jaxpr -> planning graph (``remat.core.graph.Graph``).

The graph is the whole program, as the compiler will see it:

* call-like higher-order primitives (``jit``/``pjit``, ``closed_call``,
  ``custom_jvp_call``, ``custom_vjp_call``, remat, and any other primitive whose
  ``jaxpr``/``call_jaxpr`` parameter takes exactly the equation's operands) are
  inlined, recursively: the compiler inlines them too; with ``merge_repeated``, a
  recomputing region of ``remat`` is inlined as its lowering compiles it: never
  merged with the forward pass, and run only once its cotangents exist;
* control flow (``scan``, ``while``, ``cond``) and ``shard_map`` stay one op, whose
  ``working_set_bytes`` is the simulated peak of its body beyond the body's inputs
  and outputs, and whose FLOPs are the body's (times the length, for ``scan``);
* a value is sized by the bytes one device holds when ``value_bytes`` says so (an
  SPMD program: see ``sharding.py``), and an op's FLOPs shrink with its results;
* an op that communicates (a collective, a sharding annotation of a partitioned
  program, a body holding one: ``op_model.communicates``) costs, besides its FLOPs, the bytes of its
  results at ``op_model.COMMUNICATION_FLOPS_PER_BYTE``: recomputing it moves them
  again, so the algorithms prefer local recomputation;
* literals are not values (they are immediates); closed-over constants become
  program inputs named ``const``;
* equations whose results are never used (and that have no effects) are dropped, as
  the compiler's dead-code elimination would; optionally, an equation that repeats
  an earlier one (same primitive, parameters and operands) is merged with it, as
  the compiler's CSE would: this is why ``jax.checkpoint`` saves nothing on XLA:CPU.

Example::

    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda x: jnp.sin(x) @ x)(jnp.ones((4, 4)))
    >>> graph = jaxpr_to_graph(closed)
    >>> [op.label for op in graph.ops]
    ['sin', 'dot_general']
"""

from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..core.graph import Graph, GraphBuilder
from ..core.schedulers import best_schedule
from ..core.simulate import simulate
from .compat_graph import (ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var,
                           open_jaxpr_and_consts, source_line)
from .op_model import (COMMUNICATION_FLOPS_PER_BYTE, communicates, elements, fusion_kind,
                       is_half_float, is_half_precision_matmul, primitive_cost, repeatable)

__all__ = ["jaxpr_to_graph"]

#: Control flow (and ``shard_map``, whose body runs per device) kept as one op.
CONTROL_FLOW = frozenset({"scan", "while", "cond", "shard_map"})

def jaxpr_to_graph(closed_jaxpr: ClosedJaxpr | Jaxpr, *,
                   donated: Sequence[bool] | None = None,
                   merge_repeated: bool = False,
                   upcast_half_precision_matmuls: bool = False,
                   value_bytes: Mapping[Var, int] | None = None) -> Graph:
    """Converts a (closed) jaxpr into a planning graph.

    Arguments:
      closed_jaxpr: e.g. ``jax.make_jaxpr(jax.grad(loss))(params, batch)``.
      donated: for each of the jaxpr's inputs, whether its buffer is donated.
      merge_repeated: merge an equation that repeats an earlier one (same primitive,
        parameters and operands) into it, as XLA's CSE does; this is what undoes
        ``jax.checkpoint`` on XLA:CPU. Off by default, so that op ``i`` of the graph
        stays equation ``i`` of an inlined, dead-code-free jaxpr (the automatic
        pass maps plans back to equations that way).
      upcast_half_precision_matmuls: model XLA:CPU, which runs bf16/f16 dots and
        convolutions in f32: each 16-bit operand gets one f32 copy (shared by every
        matmul that reads it, as XLA's CSE shares it), the matmul writes f32, and a
        convert brings the result back to 16 bits.
      value_bytes: bytes of some of the jaxpr's own variables (not those of inlined
        bodies) in place of their avals' sizes: the shard one device holds, for
        an SPMD program (``sharding.program_sizes``). An op's FLOPs are scaled by
        how its results' bytes compare with their avals'.

    Returns:
      a :class:`remat.core.graph.Graph`; its inputs are the jaxpr's inputs in order,
      then its constants.
    """
    jaxpr, consts = open_jaxpr_and_consts(closed_jaxpr)
    if donated is not None and len(donated) != len(jaxpr.invars):
        raise ValueError(f"donated has {len(donated)} flags but the jaxpr has "
                         f"{len(jaxpr.invars)} inputs; give one flag per input.")
    flat = _Flattener(merge_repeated, upcast_half_precision_matmuls, value_bytes)
    arg_ids = [flat.new_input(v.aval, "", bool(donated[i]) if donated else False, v)
               for i, v in enumerate(jaxpr.invars)]
    out_ids = flat.inline(jaxpr, consts, arg_ids)
    return flat.build([o for o in out_ids if o is not None])


class _PendingOp(NamedTuple):
    """An op collected while inlining, before dead-code elimination."""

    label: str
    inputs: list[int]
    outputs: list[int]
    flops: float
    transcendentals: float
    source: str
    fusion: str
    working_set_bytes: int
    effectful: bool
    repeatable: bool = True


class _Flattener:
    """Inlines a jaxpr into flat lists of values and ops, then builds the graph."""

    def __init__(self, merge_repeated: bool = False,
                 upcast_half_precision_matmuls: bool = False,
                 value_bytes: Mapping[Var, int] | None = None) -> None:
        self._sizes = value_bytes or {}
        self.merge_repeated = merge_repeated
        self.upcast = upcast_half_precision_matmuls
        self._f32_copy: dict[int, int] = {}  # 16-bit value -> its f32 copy
        self._computed: dict[Any, list[int]] = {}  # CSE table: key -> output ids
        self.value_bytes: list[int] = []
        self.value_shapes: list[str] = []
        self.inputs: list[tuple[int, str, bool]] = []  # (value, name, donated)
        self.ops: list[_PendingOp] = []
        self._aval_cache: dict[Any, tuple[int, str]] = {}

    def new_value(self, aval: Any, var: Any = None) -> int:
        nbytes, shape = self._describe(aval)
        if var is not None and self._sizes:
            nbytes = self._sizes.get(var, nbytes)
        self.value_bytes.append(nbytes)
        self.value_shapes.append(shape)
        return len(self.value_bytes) - 1

    def new_input(self, aval: Any, name: str, donated: bool, var: Any = None) -> int:
        v = self.new_value(aval, var)
        self.inputs.append((v, name, donated))
        return v

    def inline(self, jaxpr: Jaxpr, consts: Sequence[Any], in_ids: Sequence[int | None],
               caller_source: str = "") -> list[int | None]:
        """Adds ``jaxpr``'s equations; returns the ids of its outputs (``None`` for
        literals). Equations without a user source line (inside library code) get
        ``caller_source``, the line of the call that was inlined."""
        env: dict[Any, int | None] = {}
        for var, const in zip(jaxpr.constvars, consts):
            env[var] = self.new_input(_ConstAval(const), "const", False)
        for var, v in zip(jaxpr.invars, in_ids):
            env[var] = v

        def read(atom: Any) -> int | None:
            return None if isinstance(atom, Literal) else env[atom]

        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            body = _inlinable_body(eqn)
            source = source_line(eqn) or caller_source
            if body is not None and self.merge_repeated and _held_back(eqn):
                outs = self._inline_region(eqn, *body, ins, source)
            elif body is not None:
                sub_jaxpr, sub_consts = body
                outs = self.inline(sub_jaxpr, sub_consts, ins, source)
            elif self.upcast and is_half_precision_matmul(eqn):
                outs = self._add_upcast_matmul(eqn, ins, source)
            elif ((key := _cse_key(eqn, ins) if self.merge_repeated else None) is not None
                  and key in self._computed):
                outs = self._computed[key]  # XLA's CSE merges repeated computations
            else:
                outs = [self.new_value(var.aval, var) for var in eqn.outvars]
                if key is not None:
                    self._computed[key] = outs
                flops, transcendentals, working_set = _cost(eqn)
                if self._sizes and eqn.primitive.name != "shard_map":
                    share = self._device_share(eqn, ins, outs)
                    flops, transcendentals = flops * share, transcendentals * share
                if communicates(eqn, partitioned=bool(self._sizes)):
                    flops += COMMUNICATION_FLOPS_PER_BYTE * sum(self.value_bytes[o]
                                                                for o in outs)
                name = eqn.primitive.name
                fusion = _shard_map_fusion(eqn) if name == "shard_map" else fusion_kind(name)
                self.ops.append(_PendingOp(name, [i for i in ins if i is not None], outs,
                                           flops, transcendentals, source, fusion,
                                           working_set, bool(eqn.effects),
                                           repeatable(eqn)))
            for var, v in zip(eqn.outvars, outs):
                env[var] = v
        return [read(a) for a in jaxpr.outvars]

    def _inline_region(self, eqn: JaxprEqn, jaxpr: Jaxpr, consts: Sequence[Any],
                       ins: Sequence[int | None], source: str) -> list[int | None]:
        """A recomputing region as its lowering compiles it (``lowering.py``): no
        CSE merges its recomputation with the forward pass, and the recomputation
        waits for the region's late inputs (its cotangents). Its ops that read
        nothing late read a 4-byte "gate" computed from the late inputs."""
        late = [v for v in ins[len(ins) - eqn.params["num_late"]:] if v is not None]
        gate = self.new_value(_ConstAval(np.float32(0)))      # a scalar f32
        self.ops.append(_PendingOp("gate", late, [gate], 0.0, 0.0, source, "none", 0,
                                   False))
        first, merging, self.merge_repeated = len(self.ops), self.merge_repeated, False
        try:
            outs = self.inline(jaxpr, consts, ins, source)
        finally:
            self.merge_repeated = merging
        waiting = {gate, *late}         # values that exist only late
        for op in self.ops[first:]:
            if waiting.isdisjoint(op.inputs):
                op.inputs.append(gate)
            waiting.update(op.outputs)
        return outs

    def _device_share(self, eqn: JaxprEqn, ins: list[int | None], outs: list[int]
                      ) -> float:
        """The share of ``eqn``'s work one device does: that of the results it
        makes, or less where its largest operand is split further (a dot whose
        contracted dimension is split makes whole partial sums from a share of the
        products)."""
        whole = sum(self._describe(var.aval)[0] for var in eqn.outvars)
        share = sum(self.value_bytes[o] for o in outs) / whole if whole else 1.0
        operands = [(self._describe(var.aval)[0], self.value_bytes[i])
                    for var, i in zip(eqn.invars, ins) if i is not None]
        if operands:
            largest, local = max(operands)
            share = min(share, local / largest if largest else 1.0)
        return share

    def _add_upcast_matmul(self, eqn: JaxprEqn, ins: list[int | None], source: str
                           ) -> list[int]:
        """A 16-bit matmul as XLA:CPU runs it: f32 copies in, f32 out, convert back."""
        f32_ins = []
        for atom, v in zip(eqn.invars, ins):
            if v is None:
                continue
            if not is_half_float(atom.aval):
                f32_ins.append(v)
                continue
            if v not in self._f32_copy:
                copy = self._new_sized_value(2 * self.value_bytes[v],
                                             "f32" + _dims(self.value_shapes[v]))
                self.ops.append(_PendingOp("convert_element_type", [v], [copy],
                                           float(elements(atom.aval)), 0.0, source,
                                           "loop", 0, False))
                self._f32_copy[v] = copy
            f32_ins.append(self._f32_copy[v])
        (out_var,) = eqn.outvars
        out = self.new_value(out_var.aval)
        wide = self._new_sized_value(2 * self.value_bytes[out],
                                     "f32" + _dims(self.value_shapes[out]))
        flops, transcendentals, _ = _cost(eqn)
        self.ops.append(_PendingOp(eqn.primitive.name, f32_ins, [wide], flops,
                                   transcendentals, source, "none", 0, False))
        self.ops.append(_PendingOp("convert_element_type", [wide], [out],
                                   float(elements(out_var.aval)), 0.0, source, "loop", 0,
                                   False))
        return [out]

    def _new_sized_value(self, nbytes: int, shape: str) -> int:
        self.value_bytes.append(nbytes)
        self.value_shapes.append(shape)
        return len(self.value_bytes) - 1

    def build(self, outputs: list[int]) -> Graph:
        # Dead-code elimination, as the compiler does.
        needed = [False] * len(self.value_bytes)
        for v in outputs:
            needed[v] = True
        keep = [False] * len(self.ops)
        for k in range(len(self.ops) - 1, -1, -1):
            op = self.ops[k]
            if op.effectful or any(needed[v] for v in op.outputs):
                keep[k] = True
                for v in op.inputs:
                    needed[v] = True
        builder = GraphBuilder()
        new_id: list[int] = [-1] * len(self.value_bytes)
        for v, name, donated in self.inputs:
            new_id[v] = builder.add_input(self.value_bytes[v], shape=self.value_shapes[v],
                                          name=name, donated=donated)
        for op, kept in zip(self.ops, keep):
            if not kept:
                continue
            made = builder.add_op(op.label, [new_id[v] for v in op.inputs],
                                  [self.value_bytes[v] for v in op.outputs],
                                  output_shapes=[self.value_shapes[v] for v in op.outputs],
                                  flops=op.flops, transcendentals=op.transcendentals,
                                  source=op.source, fusion=op.fusion,
                                  working_set_bytes=op.working_set_bytes,
                                  repeatable=op.repeatable)
            for v, m in zip(op.outputs, made):
                new_id[v] = m
        return builder.build([new_id[v] for v in outputs])

    def _describe(self, aval: Any) -> tuple[int, str]:
        try:
            return self._aval_cache[aval]
        except KeyError:
            pass
        except TypeError:  # unhashable aval
            return _describe_aval(aval)
        described = _describe_aval(aval)
        self._aval_cache[aval] = described
        return described


def _describe_aval(aval: Any) -> tuple[int, str]:
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    text = aval.str_short() if hasattr(aval, "str_short") else str(aval)
    if shape is None or dtype is None:
        return 0, text  # tokens, refs and other non-array values
    itemsize = getattr(dtype, "itemsize", None)
    if not isinstance(itemsize, int):
        return 0, text
    return math.prod(shape) * itemsize, text


class _ConstAval:
    """The shape and dtype of a closed-over constant: what ``_describe_aval`` reads."""

    def __init__(self, const: Any) -> None:
        self.shape = tuple(getattr(const, "shape", ()))
        self.dtype = getattr(const, "dtype", None)

    def str_short(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


def _inlinable_body(eqn: JaxprEqn) -> tuple[Jaxpr, list[Any]] | None:
    name = eqn.primitive.name
    if name in CONTROL_FLOW:
        return None
    params = eqn.params
    for key in ("jaxpr", "call_jaxpr"):
        body = params.get(key)
        if isinstance(body, (ClosedJaxpr, Jaxpr)):
            jaxpr, consts = open_jaxpr_and_consts(body)
            if (len(jaxpr.invars) == len(eqn.invars)
                    and len(jaxpr.outvars) == len(eqn.outvars)):
                return jaxpr, consts
    return None


def _held_back(eqn: JaxprEqn) -> bool:
    """Whether ``eqn`` is a recomputing region of ``remat`` whose lowering keeps
    the compiler from merging it or running it before its late inputs exist."""
    params = eqn.params
    protect = params.get("prevent_cse", False)
    return (eqn.primitive.name == "remat" and bool(params.get("differentiated"))
            and params.get("num_late", 0) > 0
            and (any(protect) if isinstance(protect, tuple) else bool(protect)))


def _shard_map_fusion(eqn: JaxprEqn) -> str:
    """The fusion kind of a ``shard_map``: its body's, where the body's equations
    all fuse alike (XLA partitions the program before it fuses, so a piece of a
    split body fuses with its neighbours as its equations would)."""
    body = eqn.params["jaxpr"]
    kinds = {fusion_kind(e.primitive.name) for e in getattr(body, "jaxpr", body).eqns}
    if kinds == {"loop"}:
        return "loop"
    return kinds.pop() if len(kinds) == 1 else "none"


def _cse_key(eqn: JaxprEqn, ins: list[int | None]) -> Any:
    """What identifies ``eqn``'s computation for common-subexpression elimination,
    or ``None`` when it must not be merged (effects, control flow, unhashable
    parameters or literals)."""
    if eqn.effects or eqn.primitive.name in CONTROL_FLOW:
        return None
    operands = []
    for atom, v in zip(eqn.invars, ins):
        if v is not None:
            operands.append(v)
        elif isinstance(atom, Literal):
            operands.append(("literal", np.asarray(atom.val).tobytes(), atom.aval))
        else:
            return None  # a literal forwarded through an inlined call: rare, skip
    try:
        key = (eqn.primitive.name, tuple(operands), tuple(sorted(eqn.params.items())))
        hash(key)
    except TypeError:
        return None
    return key


def _dims(shape_text: str) -> str:
    """``"bf16[4,8]"`` -> ``"[4,8]"``."""
    start = shape_text.find("[")
    return shape_text[start:] if start >= 0 else shape_text


def _cost(eqn: JaxprEqn) -> tuple[float, float, int]:
    """``(flops, transcendentals, working_set_bytes)`` of a non-inlined equation."""
    if eqn.primitive.name in CONTROL_FLOW:
        return _control_flow_cost(eqn)
    return (*primitive_cost(eqn), 0)


def _control_flow_cost(eqn: JaxprEqn) -> tuple[float, float, int]:
    name = eqn.primitive.name
    params = eqn.params
    if name == "scan":
        bodies, repeat = [params["jaxpr"]], float(params["length"])
    elif name == "shard_map":
        bodies, repeat = [params["jaxpr"]], 1.0    # per-device shapes already
    elif name == "while":
        bodies, repeat = [params["body_jaxpr"], params["cond_jaxpr"]], 1.0  # trips unknown
    else:
        bodies, repeat = list(params["branches"]), 1.0
    flops = transcendentals = 0.0
    working_set = 0
    for body in bodies:
        graph = jaxpr_to_graph(body)
        body_flops = sum(op.flops for op in graph.ops)
        body_trans = sum(op.transcendentals for op in graph.ops)
        if name == "cond":  # one branch runs
            flops, transcendentals = max(flops, body_flops), max(transcendentals, body_trans)
        else:
            flops += repeat * body_flops
            transcendentals += repeat * body_trans
        working_set = max(working_set, _body_working_set(graph))
    return flops, transcendentals, working_set


def _body_working_set(graph: Graph) -> int:
    """Bytes a body needs beyond its inputs and outputs (which live outside it)."""
    if not graph.ops:
        return 0
    peak = simulate(graph, best_schedule(graph), check=False).peak_bytes
    boundary = graph.total_bytes([*graph.inputs, *graph.outputs])
    return max(0, peak - boundary)

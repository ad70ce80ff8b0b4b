"""The program graph every planning algorithm works on.

A :class:`Graph` is a dataflow DAG of *values* (buffers, with a size in bytes) and
*ops* (computations, with a cost). Ids are plain ints: ``graph.values[v]`` and
``graph.ops[o]``. Program inputs are live from the start (and, unless donated, to
the end); program outputs are live from their definition to the end.

The rule: a graph never changes once made. Its derived facts (the users of each
value, each op's neighbours, a topological order, the fusion of
``remat.core.fusion``) are pure functions of it, worked out when it is built;
nothing is written on it afterwards. What planners work out about the graph on
one order of its ops lives in a :class:`remat.core.scheduled.Scheduled`, which
they receive. Nothing here knows about JAX: adapters (``remat._jax.to_graph``)
build it.

Example::

    >>> b = GraphBuilder()
    >>> x = b.add_input(400, shape="f32[100]")
    >>> (y,) = b.add_op("sin", [x], [400], flops=100, transcendentals=100)
    >>> (z,) = b.add_op("reduce_sum", [y], [4], flops=100)
    >>> g = b.build(outputs=[z])
    >>> g.topological_order, g.users
    ((0, 1), ((0,), (1,), ()))
    >>> g.users = ()
    Traceback (most recent call last):
    ...
    dataclasses.FrozenInstanceError: cannot assign to field 'users'
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterable, NamedTuple, Sequence

from .fusion import Fusion, fusion_of

__all__ = ["Value", "Op", "Graph", "GraphBuilder", "GraphError", "FUSION_KINDS"]


class GraphError(ValueError):
    """A graph is malformed (dangling id, cycle, value defined twice ...)."""


#: The fusion kinds of an op (see ``Op.fusion``).
FUSION_KINDS = ("none", "loop", "copied", "reduce")


class Value(NamedTuple):
    """A buffer.

    Attributes:
      nbytes: its size in bytes.
      producer: id of the op that defines it; ``None`` for a program input.
      shape: the shape for display, e.g. ``"f32[2048,512]"``.
      name: an optional name for display.
    """

    nbytes: int
    producer: int | None = None
    shape: str = ""
    name: str = ""


class Op(NamedTuple):
    """A computation.

    Attributes:
      label: what it computes, e.g. ``"dot_general"`` (for display and logs).
      inputs: ids of the values it reads (in operand order; may repeat).
      outputs: ids of the values it defines.
      flops: estimated floating-point operations.
      transcendentals: estimated transcendental evaluations (exp, tanh, ...).
      source: the user source line it came from, e.g. ``"model.py:12 (loss)"``.
      fusion: how the compiler may fuse it (see ``remat.core.fusion``):
        ``"loop"`` for elementwise-like ops (elementwise math, convert, broadcast,
        reshape, select ...) that fuse with their neighbours; ``"copied"`` for a
        ``"loop"`` op the compiler computes again inside each fusion reading it
        (seen in its compiled program, :meth:`Graph.with_copied`); ``"reduce"`` for ops
        that absorb fusible producers but whose outputs are materialized
        (reductions); ``"none"`` for the rest (dots, convolutions, loops ...).
      working_set_bytes: scratch memory the op needs while it runs, beyond its inputs
        and outputs (the body of a loop or a conditional).
      repeatable: whether a second run gives the same results and repeats no
        effect, as far as what it holds inside goes (False for a conditional
        whose branch prints); its label alone may still rule a second run out
        (:mod:`remat.core.algorithms.recomputable`).
    """

    label: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    flops: float = 0.0
    transcendentals: float = 0.0
    source: str = ""
    fusion: str = "none"
    working_set_bytes: int = 0
    repeatable: bool = True


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """An immutable dataflow graph (see the module docstring).

    Every attribute is set when the graph is made and never changes: the derived
    ones are pure functions of the others (for a graph :meth:`rewired` made,
    ``predecessors`` and ``successors``, which planners do not read there, are
    worked out on first use). Nothing about a schedule lives here;
    what algorithms know of the graph on one order of its ops is a
    :class:`remat.core.scheduled.Scheduled`.

    Attributes:
      values: every value; its id is its index.
      ops: every op; its id is its index.
      inputs: ids of the program inputs, in argument order.
      outputs: ids of the program outputs, in result order (may repeat).
      donated: ids of the program inputs whose buffers the program may reuse; they
        are freed after their last use instead of living to the end.
      users: for each value, the ids of the ops that read it (each op once, in id
        order). Derived.
      predecessors: for each op, the ids of the ops it reads from (each once, in
        operand order). Derived.
      successors: for each op, the ids of the ops that read from it (each once, in
        id order). Derived.
      topological_order: the op ids in a topological order (ties broken by id, so
        a graph built in program order keeps that order). Derived; for a graph a
        rewrite made (:meth:`rewired`), the running order the rewrite gave.
      fusion: which values a fusing compiler keeps out of memory
        (:class:`remat.core.fusion.Fusion`). Derived.
    """

    values: tuple[Value, ...]
    ops: tuple[Op, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    donated: frozenset[int] = frozenset()
    users: tuple[tuple[int, ...], ...] = dataclasses.field(init=False, repr=False)
    topological_order: tuple[int, ...] = dataclasses.field(init=False, repr=False)
    fusion: Fusion = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_ids(self)
        self._set(**_edges(self, users=True))
        self._set(topological_order=_topological_order(self))
        self._set(fusion=fusion_of(self))

    def _set(self, **fields: Any) -> None:
        """Sets fields while the graph is being made (never after)."""
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    @classmethod
    def rewired(cls, base: "Graph", values: tuple[Value, ...], ops: tuple[Op, ...],
                changed: Sequence[int], order: tuple[int, ...]) -> "Graph":
        """``base`` with new ops and values appended and some of its ops reading
        other values, as a planner rewriting a checked graph makes it: ``values``
        and ``ops`` start with ``base``'s (same ids), ``changed`` names every op
        that is new or reads other values than in ``base``, and ``order`` is a
        topological order. Nothing is checked: ``users`` and ``fusion`` are
        ``base``'s with what the changed ops touch redone (a rewrite touches a
        few ops of a big program, and planners make many rewrites), and
        ``predecessors`` and ``successors`` are worked out on first use; each
        equals that of the same graph built whole."""
        graph = object.__new__(cls)
        graph._set(values=values, ops=ops, inputs=base.inputs, outputs=base.outputs,
                   donated=base.donated, topological_order=order)
        graph._set(users=_users_after_rewiring(graph, base, changed))
        graph._set(fusion=fusion_of(graph, base, changed))
        return graph

    def with_copied(self, op_ids: Iterable[int]) -> "Graph":
        """This graph with each ``"loop"`` op of ``op_ids`` made ``"copied"``: one
        the compiler computes again inside each fusion reading it, as its
        compiled program showed (``self`` if that changes no op).

        >>> b = GraphBuilder()
        >>> x = b.add_input(4)
        >>> (y,) = b.add_op("mul", [x, x], [4], fusion="loop")
        >>> g = b.build(outputs=[y])
        >>> g.with_copied([0]).ops[0].fusion, g.with_copied([]) is g
        ('copied', True)
        """
        copied = {o for o in op_ids if self.ops[o].fusion == "loop"}
        if not copied:
            return self
        ops = tuple(op._replace(fusion="copied") if o in copied else op
                    for o, op in enumerate(self.ops))
        return Graph(self.values, ops, self.inputs, self.outputs, self.donated)

    @functools.cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        """For each op, the ids of the ops it reads from (each once, in operand
        order). Derived."""
        return _edges(self, users=False)["predecessors"]

    @functools.cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """For each op, the ids of the ops that read from it (each once, in id
        order). Derived."""
        return _edges(self, users=False)["successors"]

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    def op_predecessors(self, op_id: int) -> tuple[int, ...]:
        """Ids of the ops whose outputs ``op_id`` reads (each once)."""
        return self.predecessors[op_id]

    def op_successors(self, op_id: int) -> tuple[int, ...]:
        """Ids of the ops that read an output of ``op_id`` (each once)."""
        return self.successors[op_id]

    def total_bytes(self, value_ids: Iterable[int]) -> int:
        """The summed size of distinct values."""
        return sum(self.values[v].nbytes for v in set(value_ids))

    def __repr__(self) -> str:
        return (f"Graph({len(self.ops)} ops, {len(self.values)} values, "
                f"{len(self.inputs)} inputs, {len(self.outputs)} outputs)")


def _edges(graph: Graph, users: bool) -> dict[str, tuple]:
    """The derived fields predecessors and successors (and with ``users``,
    users), worked out whole."""
    readers: list[list[int]] = [[] for _ in graph.values]
    predecessors: list[tuple[int, ...]] = []
    successors: list[list[int]] = [[] for _ in graph.ops]
    values = graph.values
    for op_id, op in enumerate(graph.ops):
        preds: dict[int, None] = {}
        for v in op.inputs:
            if users:
                u = readers[v]
                if not u or u[-1] != op_id:  # ops are visited in id order
                    u.append(op_id)
            p = values[v].producer
            if p is not None:
                preds[p] = None
        predecessors.append(tuple(preds))
        for p in preds:
            successors[p].append(op_id)
    edges = dict(predecessors=tuple(predecessors),
                 successors=tuple(tuple(s) for s in successors))
    if users:
        edges["users"] = tuple(tuple(u) for u in readers)
    return edges


def _users_after_rewiring(graph: Graph, base: Graph, changed: Sequence[int]
                          ) -> tuple[tuple[int, ...], ...]:
    """The users of ``graph``, made from ``base`` by appending ops and values
    and rewiring the ops in ``changed``: ``base``'s, with the edges of the
    changed ops redone."""
    n_old = len(base.ops)
    users = list(base.users) + [()] * (len(graph.values) - len(base.values))
    gone: dict[int, set[int]] = {}      # values a changed op no longer reads
    new: dict[int, dict[int, None]] = {}   # values a changed op reads now
    for o in changed:
        if o < n_old:
            for v in base.ops[o].inputs:
                gone.setdefault(v, set()).add(o)
        for v in graph.ops[o].inputs:
            new.setdefault(v, {})[o] = None
    for v, added in new.items():
        if v in gone or users[v]:
            kept = set(users[v]).difference(gone.get(v, ()))
            kept.update(added)
            users[v] = tuple(sorted(kept))
        else:           # a new value: only new readers
            users[v] = tuple(sorted(added))
    for v in gone.keys() - new.keys():
        users[v] = tuple(sorted(set(users[v]).difference(gone[v])))
    return tuple(users)


def _check_ids(graph: Graph) -> None:
    n_values = len(graph.values)
    defined_by: list[int | None] = [None] * n_values
    for op_id, op in enumerate(graph.ops):
        if op.fusion not in FUSION_KINDS:
            raise GraphError(f"op {op_id} ({op.label}) has fusion kind {op.fusion!r}; "
                             f"expected one of {FUSION_KINDS}.")
        for v in (*op.inputs, *op.outputs):
            if not 0 <= v < n_values:
                raise GraphError(f"op {op_id} ({op.label}) refers to value {v}, but the "
                                 f"graph has only {n_values} values.")
        for v in op.outputs:
            if defined_by[v] is not None:
                raise GraphError(f"value {v} is defined by op {defined_by[v]} and again "
                                 f"by op {op_id} ({op.label}); each value has one producer.")
            defined_by[v] = op_id
    for v, value in enumerate(graph.values):
        if value.producer != defined_by[v]:
            raise GraphError(f"value {v} says its producer is {value.producer}, but "
                             f"{'op ' + str(defined_by[v]) if defined_by[v] is not None else 'no op'}"
                             " defines it; build graphs with GraphBuilder to keep them consistent.")
    for v in graph.inputs:
        if graph.values[v].producer is not None:
            raise GraphError(f"program input {v} is defined by op {graph.values[v].producer}.")
    for v in (*graph.outputs, *graph.donated):
        if not 0 <= v < n_values:
            raise GraphError(f"program output or donated id {v} is not a value id.")
    if not graph.donated <= set(graph.inputs):
        raise GraphError(f"donated values {sorted(graph.donated - set(graph.inputs))} are "
                         "not program inputs; only inputs can be donated.")
    inputs = set(graph.inputs)
    for v, value in enumerate(graph.values):
        if value.producer is None and v not in inputs:
            raise GraphError(f"value {v} has no producer and is not a program input; "
                             "add it with GraphBuilder.add_input.")


def _topological_order(graph: Graph) -> tuple[int, ...]:
    import heapq

    n = len(graph.ops)
    indegree = [len(p) for p in graph.predecessors]
    ready = [o for o in range(n) if indegree[o] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        o = heapq.heappop(ready)
        order.append(o)
        for s in graph.successors[o]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, s)
    if len(order) != n:
        stuck = [o for o in range(n) if indegree[o] > 0][:5]
        raise GraphError(f"the graph has a cycle through ops {stuck}; a program graph "
                         "must be acyclic.")
    return tuple(order)


class GraphBuilder:
    """Builds a :class:`Graph` one input and one op at a time, in program order."""

    def __init__(self) -> None:
        self._values: list[Value] = []
        self._ops: list[Op] = []
        self._inputs: list[int] = []
        self._donated: set[int] = set()

    def add_input(self, nbytes: int, *, shape: str = "", name: str = "",
                  donated: bool = False) -> int:
        """Adds a program input; returns its value id."""
        v = self._new_value(nbytes, None, shape, name)
        self._inputs.append(v)
        if donated:
            self._donated.add(v)
        return v

    def add_op(self, label: str, inputs: Sequence[int], output_nbytes: Sequence[int], *,
               output_shapes: Sequence[str] | None = None, flops: float = 0.0,
               transcendentals: float = 0.0, source: str = "", fusion: str = "none",
               working_set_bytes: int = 0, repeatable: bool = True) -> tuple[int, ...]:
        """Adds an op reading ``inputs``; returns the ids of its new output values."""
        op_id = len(self._ops)
        for v in inputs:
            if not 0 <= v < len(self._values):
                raise GraphError(f"op {label!r} reads value {v}, which does not exist yet; "
                                 "add inputs and producers before their users.")
        shapes = output_shapes if output_shapes is not None else [""] * len(output_nbytes)
        outs = tuple(self._new_value(n, op_id, s, "") for n, s in zip(output_nbytes, shapes))
        self._ops.append(Op(label, tuple(inputs), outs, float(flops), float(transcendentals),
                            source, fusion, int(working_set_bytes), repeatable))
        return outs

    def build(self, outputs: Sequence[int]) -> Graph:
        """Freezes the graph with the given program outputs."""
        return Graph(tuple(self._values), tuple(self._ops), tuple(self._inputs),
                     tuple(outputs), frozenset(self._donated))

    def _new_value(self, nbytes: int, producer: int | None, shape: str, name: str) -> int:
        if nbytes < 0:
            raise GraphError(f"a value cannot have a negative size ({nbytes} bytes).")
        self._values.append(Value(int(nbytes), producer, shape, name))
        return len(self._values) - 1

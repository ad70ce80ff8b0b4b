"""The automatic pass inside a loop that is not differentiated: gradient accumulation.

A step that accumulates gradients over microbatches (a ``lax.scan`` over them,
each iteration a ``jax.grad`` of the model) holds the model's activations inside
the loop's body. The flat search sees that loop as one op, and the loop planner
(``loop_plan.py``) plans only loops that differentiation split into a forward
and a backward loop; so both would refuse every limit below the plain program.

When they refuse, the body of the program's largest such loop is planned as a
program of its own (:class:`BodyProgram`): its planning graph is the body's (the
loop's constants, carries and one iteration's slices are its inputs), and each
plan of it is measured by compiling the whole program with the rewritten body,
so the limit is on the whole program's footprint as XLA reads it. The same
search answers (``planner.py``, ``remat.core.search``), differentiated loops in
the body planned first (``loop_plan.py``). Loops that are half of a
differentiated pair are left to the loop planner. On several devices the body's
values are sized whole, not by the shard one device holds (the plans are still
judged by XLA's per-device figures, but may recompute more than they need).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from remat._jax.compat import core
from remat._jax.compat_graph import source_line
from remat._jax.inline import inline_calls
from remat._jax.loop_plan import LoopPlan
from remat._jax.loops import find_loops
from remat._jax.plan_record import MemoryLimitError, Plan
from remat._jax.program import Program, _graph_of
from remat.core.memlog import format_bytes
from remat.core.options import RematOptions

__all__ = ["BodyPlan", "BodyProgram", "plan_inside_loops"]


@dataclasses.dataclass
class BodyProgram(Program):
    """The body of the loop at equation ``index`` of ``outer.flat``, as a program
    whose plans are compiled as the whole program with that body in the loop
    (``flat`` and ``graph`` are the body's)."""
    outer: Program | None = None
    index: int = -1
    _outer_as: Any = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, outer: Program, index: int) -> "BodyProgram":
        body = inline_calls(outer.flat.jaxpr.eqns[index].params["jaxpr"])
        specs = tuple(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
                      for v in body.jaxpr.invars)
        unplaced = (None,) * len(specs)     # sized whole: see the module docstring
        # (compiled, a plan of the body is the whole program: the outer's results)
        return cls(body, _graph_of(body, specs, unplaced), outer.out_tree, specs, (),
                   outer.jit_kwargs, (outer.key, "loop body", index), unplaced, None,
                   outer, index)

    def in_outer(self, body: core.ClosedJaxpr) -> core.ClosedJaxpr:
        """The whole program with ``body`` (a rewrite of ``flat``) in the loop."""
        flat = self.outer.flat
        eqns = list(flat.jaxpr.eqns)
        eqns[self.index] = eqns[self.index].replace(
            params={**eqns[self.index].params, "jaxpr": body})
        return core.ClosedJaxpr(flat.jaxpr.replace(eqns=eqns), flat.consts)

    def function(self, closed: core.ClosedJaxpr) -> Callable:
        return self._whole().function(self.in_outer(closed))

    def lower(self, closed: core.ClosedJaxpr):     # (the outer may be a body too)
        return self._whole().lower(self.in_outer(closed))

    def _whole(self) -> Program:
        """The outer program compiled with this one's ``jit_kwargs`` (one per
        ``jit_kwargs``: its lowerings share one trace, see ``Program.lower``)."""
        if self._outer_as is None or self._outer_as.jit_kwargs is not self.jit_kwargs:
            self._outer_as = dataclasses.replace(self.outer, jit_kwargs=self.jit_kwargs)
        return self._outer_as

    @property
    def length(self) -> int:
        return self.outer.flat.jaxpr.eqns[self.index].params["length"]

    @property
    def source(self) -> str:
        return source_line(self.outer.flat.jaxpr.eqns[self.index]) or "unknown source"


@dataclasses.dataclass(frozen=True, repr=False)
class BodyPlan(LoopPlan):
    """A plan made inside a loop's body: ``graph``, ``result`` and ``loops`` are
    the body's (their FLOPs one iteration's), ``jaxpr`` the whole rewritten
    program; ``inside`` says where, ``iterations`` how often the body runs."""
    inside: str = ""
    iterations: int = 1

    @property
    def extra_flops(self) -> float:
        return super().extra_flops * self.iterations

    def __str__(self) -> str:
        return (f"{super().__str__()}\n  all inside the loop at {self.inside} "
                f"({self.iterations} iterations, not differentiated): its body is "
                "rewritten, so each iteration recomputes")


def _bodies(program: Program) -> list[int]:
    """The scans of ``program``'s top level worth planning inside (not halves of
    differentiated pairs), the one with the most equations first."""
    jaxpr = program.flat.jaxpr
    paired = {k for pair in find_loops(jaxpr) for k in (pair.forward, pair.backward)}
    eqns = jaxpr.eqns
    scans = [k for k, e in enumerate(eqns) if e.primitive.name == "scan" and k not in paired]
    return sorted(scans, key=lambda k: -len(eqns[k].params["jaxpr"].jaxpr.eqns))


def plan_inside_loops(program: Program, options: RematOptions, refused: MemoryLimitError,
                      plan: Callable[[Program, RematOptions], Plan]) -> Plan:
    """After the flat search ``refused`` the limit: ``plan`` (the pass, loops
    included) on the body of ``program``'s largest loop, against the same
    limit in bytes; re-raises ``refused`` (with what the loop reached) if there
    is no such loop or no plan of it is within the limit."""
    bodies = _bodies(program)
    if not bodies or refused.least_bytes is None:   # none, or below any program's bound
        raise refused
    body = BodyProgram.of(program, bodies[0])
    at_bytes = dataclasses.replace(options, memory_limit=refused.limit_bytes)
    try:
        inner = plan(body, at_bytes)
    except MemoryLimitError as e:
        if e.least_bytes is None:
            raise refused from e
        # the error of the search that went lower, and what the other reached
        inside = e.least_bytes <= refused.least_bytes
        main, other = (e, refused) if inside else (refused, e)
        where = (f"the loop at {body.source} ({body.length} iterations, not "
                 "differentiated)")
        note = (f"That is planning inside {where}; planning around it as a whole, "
                if inside else f"That is planning around {where}; inside it, ")
        raise MemoryLimitError(
            f"{main} {note}the least reached is "
            f"{format_bytes(other.least_bytes)}.",
            refused.limit_bytes, main.least_bytes, refused.bound_bytes) from e
    fields = {f.name: getattr(inner, f.name) for f in dataclasses.fields(inner)}
    fields.update(jaxpr=body.in_outer(inner.jaxpr), out_tree=program.out_tree,
                  inside=body.source,     # a plan inside a loop inside this one:
                  iterations=body.length * fields.get("iterations", 1))  # both counts
    return BodyPlan(**fields)

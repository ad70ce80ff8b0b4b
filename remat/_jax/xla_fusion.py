"""What XLA fused in a compiled program, read back onto the equations of its jaxpr.

The planning graph guesses which elementwise results a fusing compiler keeps out
of memory (:mod:`remat.core.fusion`). One guess is often wrong: whether XLA
computes a cheap result again inside each fusion that reads it (a bias add read
by three fusions of a gelu's backward pass) or stores it once. The compiled
plain program says which: each equation is tagged in its name stack
(:func:`tag_equations`), so every HLO instruction's ``op_name`` names the
equation it came from, and :func:`copied_equations` lists those whose results
XLA never stored: computed inside each fusion reading them, or folded away. The
planner marks their elementwise ops ``"copied"``
(:meth:`remat.core.graph.Graph.with_copied`).

>>> hlo = '''
... %fused_computation (p: f32[8]) -> f32[8] {
...   %p = f32[8]{0} parameter(0)
...   %m = f32[8]{0} multiply(%p, %p), metadata={op_name="jit(f)/remat_eqn1/mul"}
...   ROOT %e = f32[8]{0} exponential(%m), metadata={op_name="jit(f)/remat_eqn2/exp"}
... }
...
... ENTRY %main (x: f32[8]) -> f32[8] {
...   %x = f32[8]{0} parameter(0)
...   %a = f32[8]{0} add(%x, %x), metadata={op_name="jit(f)/remat_eqn0/add"}
...   ROOT %f = f32[8]{0} fusion(%a), kind=kLoop, calls=%fused_computation
... }
... '''
>>> copied_equations(hlo, 3)
{1}
"""

from __future__ import annotations

import re
from typing import Any

from remat._jax.compat import core
from remat.core.graph import Graph

__all__ = ["tag_equations", "copied_equations", "as_xla_fused"]

_TAG = "remat_eqn"
_EQUATION = re.compile(_TAG + r"(\d+)")
# a computation's first line: ``[ENTRY ]%name (params) -> type {``
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
# an instruction: ``[ROOT ]%name = type opcode(operands), attributes``
_INSTRUCTION = re.compile(r"^\s+(ROOT )?%?([\w.\-]+) = (.*)$")
_FUSION_CALL = re.compile(r"\bfusion\(.*\bcalls=%?([\w.\-]+)")
_APPLIED = re.compile(r"\bto_apply=%?([\w.\-]+)")
_TUPLE = re.compile(r"\btuple\((.*?)\)")
_OPERAND = re.compile(r"%?([\w.\-]+)")


def tag_equations(closed: core.ClosedJaxpr) -> core.ClosedJaxpr:
    """``closed`` with each equation's name stack ending in ``remat_eqnN``, ``N``
    its index: XLA's ``op_name`` of each instruction then names the equation (on
    a flat program, the planning graph's op) it comes from. Only metadata
    changes: the compiled program computes the same."""
    eqns = [e.replace(source_info=e.source_info.replace(
        name_stack=e.source_info.name_stack.extend(f"{_TAG}{i}")))
        for i, e in enumerate(closed.jaxpr.eqns)]
    return core.ClosedJaxpr(closed.jaxpr.replace(eqns=eqns), closed.consts)


def copied_equations(hlo_text: str, equations: int) -> set[int]:
    """The equations ``0 .. equations - 1`` (tagged by :func:`tag_equations`)
    whose results an optimized HLO module never stores: no instruction of theirs
    runs outside a fusion, and none is a fusion's result (each is computed
    inside the fusions reading it, or folded into other instructions).

    Reductions' ``to_apply`` computations are not read (their instructions
    carry the reduction's tag); a fusion nested in another stores nothing."""
    computations: dict[str, list[tuple[bool, str, str]]] = {}
    fused_by: dict[str, str] = {}       # fused computation -> the one calling it
    applied: set[str] = set()
    lines: list[tuple[bool, str, str]] = []
    for line in hlo_text.splitlines():
        if m := _COMPUTATION.match(line):
            lines = computations.setdefault(m[1], [])
        elif m := _INSTRUCTION.match(line):
            lines.append((bool(m[1]), m[2], m[3]))
    for name, instructions in computations.items():
        for _, _, text in instructions:
            if m := _FUSION_CALL.search(text):
                fused_by[m[1]] = name
            applied.update(_APPLIED.findall(text))

    def equation(text: str) -> int | None:
        found = _EQUATION.findall(text)
        return int(found[-1]) if found else None

    stored: set[int] = set()
    for name, instructions in computations.items():
        if name in applied:
            continue
        if name not in fused_by:
            stored.update(e for _, _, text in instructions
                          if not _FUSION_CALL.search(text)
                          and (e := equation(text)) is not None)
            continue
        if fused_by[name] in fused_by:      # nested: its result stays in the outer
            continue
        of = {inst: text for _, inst, text in instructions}
        for is_root, _, text in instructions:
            if not is_root:
                continue
            roots = [text]
            if m := _TUPLE.search(text):
                roots = [of.get(o, "") for o in _OPERAND.findall(m[1])]
            stored.update(e for r in roots if (e := equation(r)) is not None)
    return set(range(equations)) - stored


def as_xla_fused(graph: Graph, compiled: Any) -> Graph:
    """``graph`` (of the flat program ``compiled`` was compiled from, tagged)
    with the elementwise ops whose results XLA never stored made ``"copied"``;
    ``graph`` itself where that changes no value's fusion."""
    copied = graph.with_copied(copied_equations(compiled.as_text(), graph.num_ops))
    return copied if copied.fusion.fused != graph.fusion.fused else graph

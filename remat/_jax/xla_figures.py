"""XLA's figures of a compiled program: its footprint, library scratch, platform.

The automatic pass judges every plan by what XLA reports of the compiled
program (``compiled.memory_analysis()``), never by the planner's model alone:
footprint = arguments + outputs + temporaries - aliased bytes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax

__all__ = ["XlaFootprint", "library_scratch_bytes", "single_platform"]

# A library call's workspace in optimized HLO: a byte array in the result tuple of
# a custom call (cuBLAS and cuDNN calls on GPU: ``(f32[...], s8[33554432]) custom-call``).
_CUSTOM_CALL = re.compile(r"= \((.*)\) custom-call\(")
_BYTE_ARRAY = re.compile(r"\b[su]8\[(\d+)\]")


def library_scratch_bytes(hlo_text: str) -> int:
    """The largest workspace a library call of an optimized HLO module asks for.

    XLA:GPU gives each cuBLAS/cuDNN call a scratch buffer and counts it in the
    temporaries; the calls run one at a time and share it, and no
    rematerialization makes it smaller.

    >>> library_scratch_bytes("%c = (f32[8]{0}, s8[1024]{0}) custom-call(%a), "
    ...                       'custom_call_target="__cublas$gemm"')
    1024
    """
    return max((int(n) for line in _CUSTOM_CALL.findall(hlo_text)
                for n in _BYTE_ARRAY.findall(line)), default=0)


@dataclasses.dataclass(frozen=True)
class XlaFootprint:
    """XLA's memory figures of a compiled program, in bytes.

    ``scratch`` is the part of ``temp`` that library calls use as workspace
    (:func:`library_scratch_bytes`): fixed whatever is recomputed.
    """
    argument: int
    output: int
    temp: int
    alias: int
    scratch: int = 0

    @property
    def total(self) -> int:
        """What the program needs: arguments + outputs + temporaries - aliased."""
        return self.argument + self.output + self.temp - self.alias

    @property
    def fixed(self) -> int:
        """What no rematerialization changes: arguments, outputs (less aliased
        bytes) and library scratch."""
        return self.argument + self.output - self.alias + self.scratch

    @property
    def held_whatever(self) -> int:
        """A true lower bound on any program with these arguments and outputs:
        arguments + outputs - aliased bytes (temporaries are never negative)."""
        return self.argument + self.output - self.alias

    @classmethod
    def of(cls, compiled) -> "XlaFootprint":
        """The figures of a ``jax.stages.Compiled``. Library workspaces are
        looked for on GPUs only (printing a big module's text takes tens of
        milliseconds, once per plan the search compiles)."""
        m = compiled.memory_analysis()
        scratch = (library_scratch_bytes(compiled.as_text())
                   if _platforms(compiled) & _LIBRARY_PLATFORMS else 0)
        return cls(m.argument_size_in_bytes, m.output_size_in_bytes,
                   m.temp_size_in_bytes, m.alias_size_in_bytes,
                   min(scratch, m.temp_size_in_bytes))

    def limit_bytes(self, limit: int | float) -> int:
        """A ``memory_limit`` in bytes: as given, or for a fraction, the fixed bytes
        plus that fraction of the temporaries recomputation can shrink.

        >>> XlaFootprint(10, 20, 1000, 5, 400).limit_bytes(0.5)
        725
        """
        if isinstance(limit, float):
            return int(self.fixed + limit * (self.temp - self.scratch))
        return limit


#: Platforms whose library calls (cuBLAS, cuDNN, their ROCm peers) take workspaces.
_LIBRARY_PLATFORMS = frozenset({"gpu", "cuda", "rocm"})


def _devices(compiled: Any) -> set:
    shardings = [*jax.tree.leaves(compiled.input_shardings),
                 *jax.tree.leaves(compiled.output_shardings)]
    return set().union(*(s.device_set for s in shardings)) or {jax.devices()[0]}


def _platforms(compiled: Any) -> set[str]:
    return {d.platform for d in _devices(compiled)}


def single_platform(compiled: Any) -> str | None:
    """The platform of a compiled program that runs on one device; None for one
    partitioned over several (whose regions the default lowering does not gate:
    see ``lowering._default_on``)."""
    devices = _devices(compiled)
    return next(iter(devices)).platform if len(devices) == 1 else None

"""The automatic pass: ``remat.plan`` and ``remat.jit``.

Trace the whole program (a loss, its gradient, a train step) and flatten it
(``program.py``); plan it with the algorithms of ``remat.core.algorithms`` at the
targets the search asks for, rewrite each plan (``rewrite.py``: each region one
opaque ``remat_p`` equation) and compile it, reading XLA's own footprint
(``planner.py``); answer the limit with the cheapest compiled plan within it
(``remat.core.search``). Differentiated loops are planned first
(``loop_plan.py``); where the limit is still refused, the body of the largest
loop that is not differentiated (gradient accumulation, ``loop_body.py``). If no
plan of the search is within the limit, :class:`MemoryLimitError` says what was
reached.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from remat._flags import flags_from_env
from remat._jax.call import CallSpec, CallSplit, OutputTree
from remat._jax.compat import core
from remat._jax.dumps import dump_plan
from remat._jax.loop_body import plan_inside_loops
from remat._jax.loop_plan import plan_with_loops
from remat._jax.plan_record import MemoryLimitError, Plan, _CompiledCall
from remat._jax.planner import Planner, planner_for
from remat._jax.program import Program, trace_program
from remat.core.memlog import format_bytes
from remat.core.options import PORTFOLIO, RematOptions, resolve_options

__all__ = ["MemoryLimitError", "Plan", "RematJitted", "jit", "plan"]


def plan_program(fun: Callable, args: tuple, kwargs: dict, options: RematOptions,
                 spec: CallSpec, jit_kwargs: dict) -> Plan:
    """Traces ``fun(*args, **kwargs)``, searches, and returns the plan for
    ``options.memory_limit``; raises :class:`MemoryLimitError` if none is within it."""
    program, _ = trace_program(fun, args, kwargs, spec, jit_kwargs)
    return _plan_program(program, options, spec)


def _plan_program(program: Program, options: RematOptions, spec: CallSpec) -> Plan:
    """The plan of a traced program: its differentiated loops and the flat
    program around them; where that is refused, inside its largest loop that is
    not differentiated (gradient accumulation, ``loop_body.py``)."""
    try:
        return plan_with_loops(program, options, lambda p, o: _plan_traced(p, o, spec))
    except MemoryLimitError as refused:
        return plan_inside_loops(program, options, refused,
                                 lambda p, o: _plan_program(p, o, spec))


def _plan_traced(program: Program, options: RematOptions, spec: CallSpec) -> Plan:
    """The flat search's plan of a traced program for ``options.memory_limit``."""
    planner = planner_for(program, options)
    seconds, compiling = planner.plan_seconds, planner.compile_seconds
    compiles = planner.compiles
    if planner.answers == 0:
        seconds = compiling = 0.0       # a new planner: its setup is this call's
    limit = planner.baseline.limit_bytes(options.memory_limit)
    point = planner.answer(limit)
    if point is None:
        lowest = planner.lowest()
        raise MemoryLimitError(refusal(planner, limit), limit, lowest.footprint,
                               planner.baseline.held_whatever)
    m = point.payload
    plan = Plan(limit, planner.baseline, m.footprint, m.result, program.graph, m.jaxpr,
                planner.plan_seconds - seconds, program.out_tree,
                _CompiledCall(m.compiled, spec, program.out_tree), m.small_node_bytes,
                point.column,
                planner.compile_seconds - compiling, planner.compiles - compiles,
                # what its result does not show: the program as written's own regions
                point.extra_flops - m.result.extra_flops)
    dump_plan(plan, options)
    return plan


def refusal(planner: Planner, limit: int) -> str:
    """Why ``limit`` is refused: the least footprint reached, a true lower bound,
    and only the advice that applies to the settings given."""
    options, base = planner.options, planner.baseline
    lowest = planner.lowest()
    algorithms = planner.algorithms()
    if limit < base.held_whatever:
        return (f"remat: cannot meet memory_limit={format_bytes(limit)} ({limit} bytes): "
                f"no program with these arguments and outputs goes below "
                f"{format_bytes(base.held_whatever)} (arguments + outputs - donated "
                f"bytes); XLA's footprint of the program as written is "
                f"{format_bytes(base.total)}.")
    frontiers = [f for f in (planner.frontier, planner.fused) if f is not None]
    plans = (f"{sum(f.compiles for f in frontiers)} distinct plans of "
             f"{', '.join(map(repr, algorithms))} compiled")
    untried = sum(f.untried for f in frontiers)
    if any(f.out_of_compiles for f in frontiers):
        searched = (f"the search stopped after compiling {planner.frontier.max_compiles} "
                    f"plans for this limit, with planning targets at or below it left "
                    f"untried ({plans})")
    elif untried:
        searched = (f"every planning target at or below this limit's was tried but "
                    f"{untried} of a slow algorithm's, below plans of it that repeated "
                    f"one compiled ({plans})")
    else:
        searched = f"every planning target at or below this limit's was tried ({plans})"
    text = (f"remat: cannot meet memory_limit={format_bytes(limit)} ({limit} bytes). "
            f"XLA's footprint of the program is {format_bytes(base.total)}; the least "
            f"reached is {format_bytes(lowest.footprint)} ({lowest.footprint} bytes; "
            f"{lowest.column}, +{lowest.extra_flops / 1e9:.2f} GFLOP), so a limit of "
            f"{lowest.footprint} bytes or more is met; {searched}. No program with these "
            f"arguments and outputs goes below {format_bytes(base.held_whatever)} "
            f"(arguments + outputs - donated bytes)")
    if base.scratch:
        text += (f", and none of this pass below {format_bytes(base.fixed)} with the "
                 f"{format_bytes(base.scratch)} of library scratch (cuBLAS/cuDNN "
                 "workspace) that recomputation does not shrink")
    advice = []
    if options.small_node_given and options.small_node_bytes > 0:
        advice.append(f"small_node_limit={format_bytes(options.small_node_bytes)} keeps "
                      "every smaller value; a lower one (0: none kept) lets plans go lower")
    if options.algorithm != PORTFOLIO:
        others = [a for a in ("path", "standard", "optimal") if a != options.algorithm]
        advice.append(f"algorithm={options.algorithm!r} was chosen; the default (no "
                      f"algorithm=) also tries {', '.join(map(repr, others))} (\"optimal\""
                      " on programs of a few hundred ops)")
    return text + "." + (" " + "; ".join(advice) + "." if advice else "")


# ----------------------------------------------------------------------- public

_KEYWORDS = ("memory_limit", "algorithm", "scheduler", "small_node_limit", "dump_to")


def _options(given: dict) -> RematOptions:
    return resolve_options({k: v for k, v in given.items() if v is not _UNSET},
                           flags_from_env())


_UNSET: Any = object()


def plan(fun: Callable, *args: Any, memory_limit: Any = _UNSET,
         algorithm: str = _UNSET, scheduler: str = _UNSET,
         small_node_limit: Any = _UNSET, dump_to: str | None = _UNSET,
         **kwargs: Any) -> Plan:
    """Plans ``fun(*args, **kwargs)`` under ``memory_limit`` and compiles the
    result, without running it. See :func:`jit` for the arguments.

    >>> import jax, jax.numpy as jnp, remat
    >>> def loss(ws, x):
    ...     for w in ws:
    ...         x = jnp.tanh(x @ w)
    ...     return jnp.sum(x ** 2)
    >>> ws = [jnp.eye(256) * 0.9] * 12
    >>> p = remat.plan(jax.grad(loss), ws, jnp.ones((1024, 256)), memory_limit=0.7)
    >>> p.met, p.planned.total <= p.limit_bytes < p.baseline.total
    (True, True)
    """
    options = _options(dict(memory_limit=memory_limit, algorithm=algorithm,
                            scheduler=scheduler, small_node_limit=small_node_limit,
                            dump_to=dump_to))
    return plan_program(fun, args, kwargs, options, CallSpec(), {})


class RematJitted:
    """``remat.jit(fun, ...)``: call it like ``jax.jit(fun)``."""

    def __init__(self, fun: Callable, options: RematOptions, spec: CallSpec,
                 jit_kwargs: dict):
        functools.update_wrapper(self, fun)
        self._fun, self._options, self._spec = fun, options, spec
        self._jit_kwargs = jit_kwargs
        self._plans: dict[Any, Plan] = {}

    def plan_for(self, *args, **kwargs) -> Plan:
        """The plan used for these arguments (planned on first use)."""
        return self._entry(args, kwargs)[0]

    def _entry(self, args, kwargs) -> tuple[Plan, CallSplit]:
        split = CallSplit.of(args, kwargs, self._spec)
        if split.key not in self._plans:
            self._plans[split.key] = plan_program(self._fun, args, kwargs, self._options,
                                                  self._spec, self._jit_kwargs)
        return self._plans[split.key], split

    def lower(self, *args, **kwargs) -> "Lowered":
        """Lowers the rewritten program; ``.compile()`` on the result gives a
        callable taking these same arguments, as ``jax.jit``'s does."""
        plan, split = self._entry(args, kwargs)
        placed = ({"in_shardings": split.shardings}
                  if any(s is not None for s in split.shardings) else {})
        lowered = jax.jit(lambda *xs: plan.out_tree.placeholder(
            core.jaxpr_as_fun(plan.jaxpr)(*xs)),
            donate_argnums=split.donated, **placed,
            **self._jit_kwargs).lower(*split.dynamic)
        return Lowered(lowered, split.key, lambda a, k: CallSplit.of(a, k, self._spec),
                       plan.out_tree)

    def __call__(self, *args, **kwargs):
        plan, split = self._entry(args, kwargs)
        return plan.out_tree.restore(plan.compiled._compiled(*split.dynamic))

    def __get__(self, obj, objtype=None):
        """As a method, the object comes first (``static_argnums=0`` for an
        object that is not a pytree), as ``jax.jit`` binds it."""
        return self if obj is None else _BoundJitted(self, obj)


class _BoundJitted:
    """A :class:`RematJitted` method bound to an object (passed first)."""

    def __init__(self, jitted: RematJitted, obj: Any):
        self._jitted, self._obj = jitted, obj

    def __call__(self, *args, **kwargs):
        return self._jitted(self._obj, *args, **kwargs)

    def plan_for(self, *args, **kwargs) -> Plan:
        return self._jitted.plan_for(self._obj, *args, **kwargs)

    def lower(self, *args, **kwargs) -> "Lowered":
        return self._jitted.lower(self._obj, *args, **kwargs)


class _Staged:
    """A stage of ``jax.jit``'s ahead-of-time API (its methods are there), with
    the call key it was made for and the call split that takes ``f``'s arguments."""

    def __init__(self, of, key, split: Callable, out_tree: OutputTree):
        self._of, self._key, self._split, self._out = of, key, split, out_tree

    def __getattr__(self, name):
        return getattr(self._of, name)


class Lowered(_Staged):
    """``remat.jit(f).lower(*args)``: ``jax.jit``'s lowered program of the plan
    (``as_text``, ...); ``compile()`` gives a :class:`Compiled` that takes
    ``f``'s own arguments."""

    def compile(self, *args, **kwargs) -> "Compiled":
        return Compiled(self._of.compile(*args, **kwargs), self._key, self._split,
                        self._out)


class Compiled(_Staged):
    """``remat.jit(f).lower(*args).compile()``: call it with arguments like
    those it was lowered for (``memory_analysis``, ... are ``jax.jit``'s)."""

    def __call__(self, *args, **kwargs):
        split = self._split(args, kwargs)
        if split.key != self._key:
            raise TypeError("remat.jit: the compiled program was lowered for "
                            "arguments of other shapes, types or static values; "
                            "lower it again for these (or call the remat.jit "
                            "function, which plans each signature once).")
        return self._out.restore(self._of(*split.dynamic))


def jit(fun: Callable, *, memory_limit: Any = _UNSET, algorithm: str = _UNSET,
        scheduler: str = _UNSET, small_node_limit: Any = _UNSET,
        dump_to: str | None = _UNSET, **jit_kwargs: Any) -> RematJitted:
    """``jax.jit(fun)``, with the program rewritten to fit in ``memory_limit``.

    Arguments:
      fun: any function: a loss, its gradient, a whole training step. Its
        arguments are pytrees; array leaves and Python numbers are traced (as
        ``jax.jit`` traces them: a Flax ``TrainState``'s ``step=0``), except
        numbers inside an Equinox module (a dropout rate), which are static, as
        ``equinox.filter_jit`` keeps them; every other leaf (a function, a
        string) is static. Its results likewise: a returned model's functions
        and rates come back as they were when traced.
      memory_limit: the footprint XLA may use (arguments + outputs + temporaries -
        aliased bytes, as ``compile().memory_analysis()`` reports): an int > 0
        (bytes), a string (``"512MiB"``, ``"2GiB"``), or a float in (0, 1]: the
        program's own arguments and outputs plus that fraction of its temporaries
        without remat (library scratch, such as XLA:GPU's cuBLAS workspace, is kept
        whole: it does not shrink with recomputation).
      algorithm: not set (default): several algorithms (``"path"``, then
        ``"standard"``, and ``"optimal"`` on programs of a few hundred ops), the
        cheapest plan XLA reads within the limit. Or one of ``"path"``,
        ``"standard"``, ``"compress"``, ``"standardcompress"``, ``"optimal"`` (the
        least recompute by integer programming; its time limit per solve is
        ``REMAT_FLAGS=--solver_seconds=``, default 60).
      scheduler: ``"best"`` (default), ``"list"``, ``"dfs"`` or ``"postorder"``.
      small_node_limit: values smaller than this (bytes or a size string) are
        never recomputed. When not given (here or in ``REMAT_FLAGS``), 1 MiB,
        halved as far as needed when the values it keeps alone would exceed a
        planning target (``Plan.small_node_bytes`` says what was used).
      dump_to: a directory for the plan, and with ``REMAT_FLAGS`` ``--dump_dot`` /
        ``--dump_memlog``, the DOT graphs before and after and the memory log.
      **jit_kwargs: as ``jax.jit`` takes them: ``static_argnums``,
        ``static_argnames``, ``donate_argnums``, ``donate_argnames``,
        ``in_shardings``, ``out_shardings`` and the others ``jax.jit`` passes on
        (``keep_unused``, ``device``, ...). On a multi-device program the results
        keep the plain program's shardings unless ``out_shardings`` says otherwise.

    Unset settings come from the ``REMAT_FLAGS`` environment variable. Raises
    :class:`MemoryLimitError` (with the least footprint reached and a lower bound)
    when no plan of the search is within the limit. A limit met is met for every
    higher limit, with no more recompute (``remat.core.search``).

    >>> import jax, jax.numpy as jnp, remat
    >>> def loss(ws, x, scale):
    ...     for w in ws:
    ...         x = jnp.tanh(x @ w) * scale
    ...     return jnp.sum(x ** 2)
    >>> step = remat.jit(jax.grad(loss), memory_limit=0.7, static_argnums=2)
    >>> grads = step([jnp.eye(256) * 0.9] * 12, jnp.ones((1024, 256)), 2.0)
    >>> len(grads)
    12
    """
    options = _options(dict(memory_limit=memory_limit, algorithm=algorithm,
                            scheduler=scheduler, small_node_limit=small_node_limit,
                            dump_to=dump_to))
    jit_kwargs = dict(jit_kwargs)
    spec = CallSpec.of(fun, jit_kwargs)
    return RematJitted(fun, options, spec, jit_kwargs)

"""Every use of JAX internals (``jax._src``) by the checkpoint adapter, in one place.

remat runs on jax 0.10.2 and later 0.10 releases (pyproject.toml's range).
0.10.2 is the floor: earlier releases name an effect's input by position only
(``JaxprInputEffect.input_index``) and lack ``core.positional_effects``,
``core.eqn_effects(jaxpr, invars)`` and ``mlir.ir_tree_registry``, which the
primitive, ref and lowering rules use. The public modules
``jax.interpreters.{ad,batching,mlir,partial_eval}`` and ``jax.extend`` expose the
rule tables we register into; the names below are what they do not expose. When
the range moves, this is the one file to revisit.
"""

from __future__ import annotations

import os
import re
import warnings

import jax

from jax._src import api_util as api_util
from jax._src import core as core
from jax._src import effects as effects
from jax._src import linear_util as lu
from jax._src import source_info_util as source_info_util
from jax._src.config import mutable_array_checks as mutable_array_checks
from jax._src.ad_checkpoint import name_p as name_p
from jax._src.ad_util import Zero as Zero
from jax._src.sharding_impls import ShardingContext as ShardingContext
from jax._src.interpreters import ad as ad
from jax._src.interpreters import batching as batching
from jax._src.interpreters import mlir as mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lax.lax import reduce_precision_p as reduce_precision_p
from jax._src.lib.mlir import ir as ir
from jax._src.lib.mlir.dialects import hlo as hlo
from jax._src.state import discharge as state_discharge
from jax._src.state.types import AbstractRef as AbstractRef
from jax._src.state.types import AccumEffect as AccumEffect
from jax._src.state.types import WriteEffect as WriteEffect
from jax._src.util import weakref_lru_cache as weakref_lru_cache

#: The jax releases remat is tested on: from the first, up to (not including) the
#: second; pyproject.toml pins the same range.
TESTED_RANGE = ((0, 10, 2), (0, 11))


def untested_release_warning(version: str) -> str | None:
    """What to tell a user whose ``jax.__version__`` lies outside
    :data:`TESTED_RANGE` (None inside it). pip keeps the range; a source checkout
    or ``--no-deps`` install on an image with another jax does not.

    >>> untested_release_warning("0.10.2") is None
    True
    >>> untested_release_warning("0.11.2")[:41]
    'remat is tested on jax >=0.10.2,<0.11 and'
    """
    release = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    low, high = TESTED_RANGE
    if low <= release < high:
        return None
    spec = f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"
    text = (f"remat is tested on jax {spec} and this is jax {version}: remat relies "
            "on JAX internals that change between releases")
    if release >= high:
        text += (" (on jax 0.11, lax.scan's parameters changed and a ClosedJaxpr is "
                 "a Jaxpr: remat.jit's loop planning fails there, and so do mutable "
                 "refs in regions)")
    return text + f". Install 'jax{spec}' and 'jaxlib{spec}'."


_untested = untested_release_warning(jax.__version__)
if _untested:
    warnings.warn(_untested, RuntimeWarning, stacklevel=2)

# Source locations recorded on equations (shown by saved_residuals and in jaxprs)
# skip remat's own frames, as they skip JAX's, so that they name the user's line.
_REMAT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
source_info_util.register_exclusion(_REMAT_DIR)

# Policy answers understood by JAX's partial evaluator (``partial_eval_jaxpr_custom``).
Saveable = pe.Saveable
Recompute = pe.Recompute
Offloadable = pe.Offloadable


def register_discharge_rule(prim, rule) -> None:
    """Registers ``rule(in_avals, out_avals, *args, **params) -> (new_invals,
    outs)`` as ``prim``'s state-discharge rule. jax 0.11 calls such rules with one
    context object (``DischargeContext``) in place of the two aval lists, and
    says in it which ``Ref`` inputs to discharge; a region discharges all of its
    refs at once, so a partial request is refused rather than half-honoured."""
    if not hasattr(state_discharge, "DischargeContext"):    # jax 0.10
        state_discharge.register_discharge_rule(prim)(rule)
        return

    def from_context(ctx, *args, **params):
        kept = [i for i, (aval, should) in enumerate(zip(ctx.in_avals, ctx.should_discharge))
                if isinstance(aval, AbstractRef) and not should]
        if kept:
            raise NotImplementedError(
                f"{prim.name}: discharging only some of a region's refs (inputs {kept} "
                "kept as refs) is not supported; discharge all of them.")
        return rule(ctx.in_avals, ctx.out_avals, *args, **params)

    state_discharge.register_discharge_rule(prim)(from_context)


def debug_info(traced_for: str, fun, args, kwargs, static_argnums=(),
               static_argnames=()):
    """JAX's record of a traced function's name, argument names and source."""
    return api_util.debug_info(traced_for, fun, args, kwargs,
                               static_argnums=static_argnums,
                               static_argnames=static_argnames)


def trace_flat(flat_fun, in_avals, dbg):
    """Traces ``flat_fun(*flat_args) -> list`` to ``(jaxpr, consts)``.

    The returned jaxpr takes the constants first, then the arguments, and has no
    constvars, which is the form the remat primitive carries.
    """
    jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(
        lu.wrap_init(flat_fun, debug_info=dbg), in_avals)
    return pe.convert_constvars_jaxpr(jaxpr), consts


def unknown_debug_info(jaxpr: core.Jaxpr):
    """Debug info for a function derived from ``jaxpr`` (argument names dropped)."""
    return jaxpr.debug_info.with_unknown_names()


def region_debug_info() -> core.DebugInfo:
    """Debug info for a region body cut out of a program by the automatic pass
    (no argument names or result paths of its own)."""
    return core.DebugInfo("remat.jit region", "<remat region>", None, None)


def sharding_proto(sharding, ndim: int):
    """``sharding`` (a ``NamedSharding``) as the lowering annotates a value with
    it: Shardy's form where JAX lowers to Shardy, else XLA's ``OpSharding``."""
    if jax.config.jax_use_shardy_partitioner:
        return sharding._to_sdy_sharding(ndim)
    return sharding._to_xla_hlo_sharding(ndim).to_proto()


def traced_as(template, closed):
    """``template`` (what ``jax.jit(f).trace(...)`` returned) with ``closed`` as its
    program: lowering it skips the trace of ``closed`` equation by equation
    (``jaxpr_as_fun``), which on a program of thousands of equations costs about
    as much as the lowering. None where ``closed`` does not take and return what
    the template's program does, or the template passes constants as arguments:
    trace it then."""
    from jax._src.stages import Traced
    params = template._params
    jaxpr = params["jaxpr"]
    if (template._consts or jaxpr.in_avals != closed.in_avals
            or jaxpr.out_avals != closed.out_avals or jaxpr.effects != closed.effects):
        return None
    program = core.ClosedJaxpr(closed.jaxpr.replace(debug_info=jaxpr.jaxpr.debug_info),
                               closed.consts)
    return Traced(template._meta_tys_flat, {**params, "jaxpr": program},
                  template._in_tree, template.out_tree, template._consts)

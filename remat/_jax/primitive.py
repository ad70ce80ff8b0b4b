"""The remat primitive, ``remat_p``, and its transformation rules.

An equation ``remat_p(*args, jaxpr=..., ...)`` runs ``jaxpr`` on ``args``. Alone it
is a call; its meaning shows under differentiation. Partial evaluation (the step of
``jax.grad``/``jax.vjp``/``jax.linearize`` that splits a program into what runs now
and what runs later) asks the equation's ``policy`` which intermediates to *save*;
everything else is left in a new ``remat_p`` equation that *recomputes* it from the
saved values when the later part runs. Transposition keeps that region whole: the
transposed equation holds the recomputation *and* the backward pass that consumes
it, fed by the incoming cotangents, so a lowering can wrap both in one region the
compiler cannot hoist from or merge with the forward pass (see ``lowering.py``).

Parameters every ``remat_p`` equation carries:

- ``jaxpr``: the body, a ``core.Jaxpr`` without constvars (constants are arguments).
- ``prevent_cse``: a bool, or a tuple of bools, one per argument; whether the
  lowering must protect the recomputation from common-subexpression elimination.
- ``differentiated``: False for a forward-only call (lowered inline); True once
  partial evaluation made it a recomputing region.
- ``policy``: the saving policy, ``(prim, *avals, **params) -> bool | RematCase``,
  or None for "save nothing but the inputs".
- ``lowering``: ``None`` (the platform's default), ``"gate"``, ``"barrier"``,
  ``"cond"`` or ``"while"``.
- ``num_late``: how many trailing arguments exist only late (the cotangents of a
  transposed region); the ``"gate"`` and ``"cond"`` lowerings hold the
  recomputation back until they exist. 0 when unknown.

Each rule is registered right after its definition.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax.numpy as jnp

from remat._jax import compat, refs, scan_passes
from remat._jax.compat import AbstractRef, ad, batching, core, pe, Zero

logger = logging.getLogger("remat")

remat_p = core.Primitive("remat")
remat_p.multiple_results = True


# -------------------------------------------------------------- helpers on params

def _select(mask: Sequence[bool], xs: Sequence[Any]) -> list[Any]:
    return [x for m, x in zip(mask, xs, strict=True) if m]


def _cse_select(prevent_cse, mask: Sequence[bool]):
    """``prevent_cse`` restricted to the arguments where ``mask`` is True."""
    if isinstance(prevent_cse, bool):
        return prevent_cse
    return tuple(_select(mask, prevent_cse))


def _cse_extend(prevent_cse, front: int, back: int):
    """``prevent_cse`` for new arguments: ``front`` unprotected ones before, ``back``
    protected ones after the existing arguments."""
    if isinstance(prevent_cse, bool):
        return prevent_cse
    return (False,) * front + tuple(prevent_cse) + (True,) * back


def _nothing_saveable(*_, **__) -> bool:
    return False


# ---------------------------------------------------------------- impl and types

def remat_impl(*args, jaxpr: core.Jaxpr, **_):
    return core.eval_jaxpr(jaxpr, (), *args)

remat_p.def_impl(remat_impl)


def remat_abstract_eval(*args, jaxpr: core.Jaxpr, **_):
    del args
    return [v.aval for v in jaxpr.outvars], core.positional_effects(jaxpr)

remat_p.def_effectful_abstract_eval(remat_abstract_eval)


# ------------------------------------------------------------------------- jvp
# Takes primals and tangents (symbolic ``Zero`` where known to be zero); returns
# primal and tangent outputs. The jvp of a region is one region computing both, so
# that partial evaluation can split it with the policy.

def remat_jvp(primals, tangents, *, jaxpr: core.Jaxpr, prevent_cse, **params):
    nonzeros = [type(t) is not Zero for t in tangents]
    jvp_closed, out_nonzeros = ad.jvp_jaxpr(pe.close_jaxpr(jaxpr), nonzeros, False)
    consts = jvp_closed.consts
    nz_tangents = [t for t in tangents if type(t) is not Zero]
    outs = remat_p.bind(
        *consts, *primals, *nz_tangents,
        jaxpr=pe.convert_constvars_jaxpr(jvp_closed.jaxpr),
        prevent_cse=_cse_extend(prevent_cse, len(consts), len(nz_tangents)),
        **dict(params, num_late=0))
    out_primals, out_nz_tangents = outs[:len(jaxpr.outvars)], iter(outs[len(jaxpr.outvars):])
    out_tangents = [next(out_nz_tangents) if nz else Zero(p.aval.to_tangent_aval())
                    for p, nz in zip(out_primals, out_nonzeros)]
    return out_primals, out_tangents

ad.primitive_jvps[remat_p] = remat_jvp


# ------------------------------------------------------------ partial evaluation

def _split_with_policy(jaxpr: core.Jaxpr, in_unknowns: Sequence[bool], policy):
    """Splits ``jaxpr`` into a known part (runs now, emits residuals) and a staged
    part (recomputes from the residuals), both dead-code eliminated.

    Returns ``(known, staged, out_unknowns, num_res, used_known_ins,
    used_staged_ins)``: ``known`` maps the used known inputs to the known outputs
    followed by ``num_res`` residuals; ``staged`` maps residuals followed by the used
    inputs (known ones instantiated) to the unknown outputs.
    """
    saveable = policy or _nothing_saveable
    n = len(jaxpr.invars)
    known, staged, out_unknowns, out_inst, num_res = pe.partial_eval_jaxpr_custom(
        jaxpr, in_unknowns, [True] * n, False, False, saveable)
    staged, used_staged = pe.dce_jaxpr(staged, _select(out_inst, out_unknowns))
    used_res, used_staged_ins = used_staged[:num_res], used_staged[num_res:]
    num_known_outs = len(known.outvars) - num_res
    known, used_known_ins = pe.dce_jaxpr(known, [True] * num_known_outs + used_res)
    num_res = sum(used_res)
    return known, staged, out_unknowns, num_res, used_known_ins, used_staged_ins


def _round_residuals(jaxpr: core.Jaxpr, num_res: int) -> core.Jaxpr:
    """Rounds each floating residual to its dtype right where it is produced (or,
    for a residual that is an input, where it enters), so every use sees the
    rounded value.

    XLA may keep a value in higher precision than its dtype (e.g. bf16 math in f32)
    when it never touches memory. A saved residual does touch memory, so without
    this the forward pass and the recomputation could see different values. Types
    are judged with ``jax.numpy``'s dtype rules: ``bfloat16`` and the float8 types
    are floating there, not in NumPy's.
    """
    res_vars = set(v for v in jaxpr.outvars[len(jaxpr.outvars) - num_res:]
                   if isinstance(v, core.Var) and _is_float(v.aval))
    eqns, invars = [], list(jaxpr.invars)
    for i, v in enumerate(jaxpr.invars):
        if v in res_vars:
            invars[i] = core.Var(v.aval)
            eqns.append(_rounding_eqn(invars[i], v, None))
    for eqn in jaxpr.eqns:
        to_round = [v for v in eqn.outvars if v in res_vars
                    and not (eqn.primitive is compat.reduce_precision_p)]
        if not to_round:
            eqns.append(eqn)
            continue
        renamed = {v: core.Var(v.aval) for v in to_round}
        eqns.append(eqn.replace(outvars=[renamed.get(v, v) for v in eqn.outvars]))
        eqns += [_rounding_eqn(raw, v, eqn) for v, raw in renamed.items()]
    return jaxpr.replace(invars=invars, eqns=eqns)


def _rounding_eqn(raw: core.Var, rounded: core.Var, producer) -> core.JaxprEqn:
    info = jnp.finfo(rounded.aval.dtype)
    where = ((producer.source_info, producer.ctx) if producer is not None else ())
    return core.new_jaxpr_eqn(
        [raw], [rounded], compat.reduce_precision_p,
        dict(exponent_bits=info.nexp, mantissa_bits=info.nmant), set(), *where)


def _is_float(aval) -> bool:
    return (isinstance(aval, core.ShapedArray) and
            jnp.issubdtype(aval.dtype, jnp.floating) and aval.dtype.itemsize > 0)


# Tracer-level rule (jax.grad / jax.vjp / jax.linearize). Takes the JaxprTrace and
# one tracer per argument (known or unknown); evaluates the known part now and
# returns tracers for the outputs: known values, or unknowns whose recipe is a new
# differentiated remat equation.
def remat_partial_eval(trace, *tracers, jaxpr: core.Jaxpr, prevent_cse, policy,
                       **params):
    refs.check_effects(jaxpr)
    if scan_passes.passes_separated() and not params["differentiated"]:
        prevent_cse = False      # the recomputation lands in a loop of its own
    in_unknowns = [not t.is_known() for t in tracers]
    known, staged, out_unknowns, num_res, used_known, used_staged = \
        _split_with_policy(jaxpr, in_unknowns, policy)
    known = _round_residuals(known, num_res)

    known_vals = _select(used_known, [t.pval.get_known() for t in tracers
                                      if t.is_known()])
    known_outs_and_res = core.eval_jaxpr(known, (), *known_vals)
    split = len(known_outs_and_res) - num_res
    known_outs, residuals = known_outs_and_res[:split], known_outs_and_res[split:]

    res_tracers = [trace.new_instantiated_const(r) for r in residuals]
    in_tracers = res_tracers + [trace.instantiate_const(t)
                                for t in _select(used_staged, tracers)]
    out_tracers = [pe.JaxprTracer(trace, pe.PartialVal.unknown(v.aval), None)
                   for v in staged.outvars]
    if not isinstance(prevent_cse, bool):
        prevent_cse = (True,) * num_res + _cse_select(prevent_cse, used_staged)
    new_params = dict(params, jaxpr=staged, policy=policy, differentiated=True,
                      prevent_cse=prevent_cse, num_late=0)
    recipe = pe.new_eqn_recipe(trace, in_tracers, out_tracers, remat_p, new_params,
                               core.positional_effects(staged),
                               compat.source_info_util.current())
    for t in out_tracers:
        t.recipe = recipe
    _log_residuals(known, num_res, staged, in_unknowns, used_staged)

    known_iter, unknown_iter = iter(known_outs), iter(out_tracers)
    return [next(unknown_iter) if uk else next(known_iter) for uk in out_unknowns]

pe.custom_partial_eval_rules[remat_p] = remat_partial_eval


def _log_residuals(known, num_res, staged, in_unknowns, used_staged):
    """Logs (logger ``"remat"``, level DEBUG) what a region saves for its backward."""
    if not logger.isEnabledFor(logging.DEBUG):
        return
    from remat._jax.residuals import describe_outputs  # avoids an import cycle
    saved_inputs = [v.aval.str_short(short_dtypes=True) for v, unknown in
                    zip(staged.invars[num_res:], _select(used_staged, in_unknowns))
                    if not unknown]
    res_jaxpr = known.replace(outvars=known.outvars[len(known.outvars) - num_res:])
    saved = describe_outputs(res_jaxpr, [""] * len(known.invars))
    lines = [f"  input {s}" for s in saved_inputs]
    lines += [f"  {aval.str_short(short_dtypes=True)} {src}" for aval, src in saved]
    logger.debug("remat region saves %d residual(s):\n%s", len(lines), "\n".join(lines))


# Jaxpr-level rule, used when a remat equation sits inside a jaxpr that is itself
# partially evaluated by a policy (a remat inside jit/scan inside a remat).
def _partial_eval_params_updater(unks_in, inst_in, kept_outs_known, inst_out,
                                 num_res, params_known, params_staged):
    del kept_outs_known, inst_out
    prevent_cse = params_known["prevent_cse"]
    if not isinstance(prevent_cse, bool):
        params_known = dict(params_known, prevent_cse=_cse_select(
            prevent_cse, [not u for u in unks_in]))
        params_staged = dict(params_staged, prevent_cse=(True,) * num_res +
                             _cse_select(prevent_cse, inst_in))
    if scan_passes.passes_separated() and not params_known["differentiated"]:
        params_staged = dict(params_staged, prevent_cse=False)   # in a loop of its own
    return (dict(params_known, num_late=0),
            dict(params_staged, differentiated=True, num_late=0))

pe.partial_eval_jaxpr_custom_rules[remat_p] = partial(
    pe.call_partial_eval_custom_rule, "jaxpr", _partial_eval_params_updater)


# --------------------------------------------------------------------- transpose
# Takes the output cotangents (``Zero`` where zero) and the arguments, linear ones
# as ``UndefinedPrimal``; returns one cotangent per argument (None for non-linear
# ones). The transposed region recomputes the non-linear part from its non-linear
# arguments and runs the backward pass inside itself.

def remat_transpose(cts, *args, jaxpr: core.Jaxpr, prevent_cse, **params):
    in_linear = tuple(ad.is_undefined_primal(x) for x in args)
    out_zeros = tuple(type(ct) is Zero for ct in cts)
    t_jaxpr, consts, in_ct_zeros = _transposed_jaxpr(
        pe.close_jaxpr(jaxpr), in_linear, out_zeros)
    nonlinear = [x for x, lin in zip(args, in_linear) if not lin]
    nz_cts = [ct for ct in cts if type(ct) is not Zero]
    nz_in_cts = iter(remat_p.bind(
        *consts, *nonlinear, *nz_cts, jaxpr=t_jaxpr,
        prevent_cse=_cse_extend(_cse_select(prevent_cse, [not l for l in in_linear]),
                                len(consts), len(nz_cts)),
        **dict(params, num_late=len(nz_cts))))
    in_cts_linear = iter([Zero(x.aval.to_ct_aval()) if zero else next(nz_in_cts)
                          for x, zero in zip(_select(in_linear, args), in_ct_zeros)])
    return [next(in_cts_linear) if lin else None for lin in in_linear]

ad.primitive_transposes[remat_p] = remat_transpose


@compat.weakref_lru_cache
def _transposed_jaxpr(jaxpr: core.ClosedJaxpr, in_linear: tuple[bool, ...],
                      out_zeros: tuple[bool, ...]):
    """The jaxpr ``(consts, non-linear args, non-zero cts) -> non-zero input cts``,
    its constants, and which input cotangents of the linear arguments are zero."""
    in_avals = ([a for a, lin in zip(jaxpr.in_avals, in_linear) if not lin] +
                [a.to_ct_aval() for a, z in zip(jaxpr.out_avals, out_zeros) if not z])
    num_nonlinear = len(in_linear) - sum(in_linear)
    zeros_cell: list[list[bool]] = []

    def transposed(*flat):
        nonlinear, nz_cts = flat[:num_nonlinear], iter(flat[num_nonlinear:])
        # A ref the backward pass writes to (a custom_vjp's residual) crosses from
        # the recomputation to the backward as a residual: allow it.
        with compat.mutable_array_checks(False):
            known, linear, out_unknowns, res_avals = pe.partial_eval_jaxpr_nounits(
                jaxpr, list(in_linear), False)
        known_outs = core.jaxpr_as_fun(known)(*nonlinear)   # the recomputation
        residuals = known_outs[len(known_outs) - len(res_avals):]
        cts = [Zero(a.to_ct_aval()) if z else next(nz_cts)
               for a, z in zip(jaxpr.out_avals, out_zeros)]
        lin_cts = [ct for ct, uk in zip(cts, out_unknowns) if uk]
        undefined = [ad.UndefinedPrimal(a) for a in linear.in_avals[len(residuals):]]
        in_cts = ad.backward_pass(linear.jaxpr, False, linear.consts,
                                  [*residuals, *undefined], lin_cts)[len(residuals):]
        zeros = [type(ct) is Zero for ct in in_cts]
        zeros_cell.append(zeros)
        return [ct for ct in in_cts if type(ct) is not Zero]

    dbg = compat.unknown_debug_info(jaxpr.jaxpr)
    t_jaxpr, consts = compat.trace_flat(transposed, in_avals, dbg)
    return t_jaxpr, consts, zeros_cell[0]


# -------------------------------------------------------------------------- vmap

def remat_vmap(axis_data, args, dims, *, jaxpr: core.Jaxpr, prevent_cse, **params):
    batched, out_batched = batching.batch_jaxpr_axes(
        pe.close_jaxpr(jaxpr), axis_data, dims,
        [batching.zero_if_mapped] * len(jaxpr.outvars))
    consts = batched.consts
    outs = remat_p.bind(
        *consts, *args, jaxpr=pe.convert_constvars_jaxpr(batched.jaxpr),
        prevent_cse=_cse_extend(prevent_cse, len(consts), 0), **params)
    return outs, [0 if b else None for b in out_batched]

batching.fancy_primitive_batchers[remat_p] = remat_vmap


# --------------------------------------------------------------------------- DCE
# Takes which outputs are used; returns which inputs are used and the pruned
# equation (None when it can go entirely).

def remat_dce(used_outputs: list[bool], eqn: core.JaxprEqn):
    body = eqn.params["jaxpr"]
    if not any(used_outputs) and not pe.has_effects(eqn):
        return [False] * len(eqn.invars), None
    new_body, used_inputs = pe.dce_jaxpr(body, used_outputs)
    new_invars = _select(used_inputs, eqn.invars)
    num_late = eqn.params["num_late"]
    new_params = dict(eqn.params, jaxpr=new_body,
                      prevent_cse=_cse_select(eqn.params["prevent_cse"], used_inputs),
                      num_late=sum(used_inputs[len(used_inputs) - num_late:])
                      if num_late else 0)
    if "out_shardings" in new_params:       # (the automatic pass's regions)
        new_params["out_shardings"] = tuple(_select(used_outputs,
                                                    list(new_params["out_shardings"])))
    new_eqn = pe.new_jaxpr_eqn(
        new_invars, _select(used_outputs, eqn.outvars), remat_p, new_params,
        core.eqn_effects(new_body, new_invars), eqn.source_info, eqn.ctx)
    return used_inputs, new_eqn

pe.dce_rules[remat_p] = remat_dce


# ------------------------------------------------------------- state discharge
# Used when a region that takes refs (``ref_effects="replay"``) is compiled: the
# refs become values in and out of the region. Returns the refs' new values (None
# for non-ref arguments) and the outputs.

def remat_discharge(in_avals, out_avals, *args, jaxpr: core.Jaxpr, prevent_cse,
                    **params):
    del out_avals
    region = refs.purify(jaxpr, discharge_inputs=True, keep_backward_refs=False)
    outs = remat_p.bind(*region.consts, *args, jaxpr=region.jaxpr,
                        prevent_cse=_cse_extend(prevent_cse, len(region.consts), 0),
                        **params)
    finals = iter(outs[len(jaxpr.outvars):])
    new_vals = [next(finals) if isinstance(a, AbstractRef) else None for a in in_avals]
    return new_vals, outs[:len(jaxpr.outvars)]

compat.register_discharge_rule(remat_p, remat_discharge)

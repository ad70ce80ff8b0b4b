"""Splitting a differentiated loop into segments (the √L scheme).

A loop of ``length = segments * size`` iterations is run as ``segments`` outer
iterations of ``size`` inner ones. The forward loop stacks only the carry at the
start of each segment; the backward loop, per segment (last first), runs the
segment's forward iterations again from that carry, stacking their residuals for
``size`` iterations only, then the segment's backward iterations over them. The
stacks shrink from ``length`` slices of residuals to ``segments`` carries plus
``size`` slices of residuals, for one more forward pass.

The program is rebuilt by tracing: every equation is bound as it is, but the
pair's two scans, which are replaced by the nested ones.
"""

from __future__ import annotations

import jax

from remat._jax.compat import core, source_info_util
from remat._jax.loops import LoopPair

__all__ = ["split_loops", "segment_sizes"]


def segment_sizes(length: int) -> list[int]:
    """The divisors of ``length`` strictly between 1 and ``length``, nearest
    ``sqrt(length)`` first (a split needs equal segments)."""
    sizes = [k for k in range(2, length) if length % k == 0]
    return sorted(sizes, key=lambda k: (abs(k * k - length), k))


def _body_fun(closed: core.ClosedJaxpr, keep: list[int]):
    """The scan body of ``closed`` returning only its outputs ``keep``."""
    def fun(*args):
        outs = core.jaxpr_as_fun(closed)(*args)
        return [outs[i] for i in keep]
    return fun


def _scan(fun, consts, carry, xs, length, reverse, num_carry):
    """``lax.scan`` of a flat ``fun(*consts, *carry, *xs) -> carry + ys``."""
    def step(c, x):
        outs = fun(*consts, *c, *x)
        return list(outs[:num_carry]), list(outs[num_carry:])
    return jax.lax.scan(step, list(carry), list(xs), length=length, reverse=reverse)


def _segments(x, segments):
    return x.reshape(segments, x.shape[0] // segments, *x.shape[1:])


def _nested(jaxpr: core.Jaxpr, pair: LoopPair, size: int):
    """``(forward, backward)``: functions computing the outputs of the pair's two
    equations from their operands, in segments of ``size`` iterations."""
    fwd, bwd = jaxpr.eqns[pair.forward], jaxpr.eqns[pair.backward]
    length = fwd.params["length"]
    if length % size or not 1 < size < length:
        raise ValueError(f"split_loop: size must divide the loop's length {length} and "
                         f"lie strictly between 1 and it, got {size}")
    segments = length // size
    fnc, fncarry = fwd.params["num_consts"], fwd.params["num_carry"]
    bnc, bncarry = bwd.params["num_consts"], bwd.params["num_carry"]
    residual = set(pair.positions)
    outputs = [p for p in range(fncarry, len(fwd.outvars)) if p not in residual]
    f_rev, b_rev = fwd.params["reverse"], bwd.params["reverse"]
    fbody = fwd.params["jaxpr"]
    run_outputs = _body_fun(fbody, list(range(fncarry)) + outputs)
    run_residuals = _body_fun(fbody, list(range(fncarry)) + sorted(residual))
    run_backward = core.jaxpr_as_fun(bwd.params["jaxpr"])
    kept: dict = {}

    def forward(*invals):
        consts, carry, xs = (invals[:fnc], invals[fnc:fnc + fncarry],
                             invals[fnc + fncarry:])

        def segment(c, seg_xs):
            c_out, ys = _scan(run_outputs, consts, c, seg_xs, size, f_rev, fncarry)
            return c_out, (list(c), ys)

        carry_out, (starts, ys) = jax.lax.scan(
            segment, list(carry), [_segments(x, segments) for x in xs], length=segments,
            reverse=f_rev)
        kept.update(consts=consts, starts=starts, xs=xs)
        out = list(carry_out) + [None] * (len(fwd.outvars) - fncarry)
        for p, y in zip(outputs, ys):
            out[p] = y.reshape(length, *y.shape[2:])
        return out

    def backward(*invals):
        consts, carry = invals[:bnc], invals[bnc:bnc + bncarry]
        xs_positions = range(bnc + bncarry, len(bwd.invars))
        from_forward = {k: fwd.outvars.index(bwd.invars[k]) for k in xs_positions
                        if bwd.invars[k] in [fwd.outvars[p] for p in residual]}
        others = [k for k in xs_positions if k not in from_forward]
        order = sorted(residual)

        def segment(c, seg):
            start, seg_fxs, seg_others = seg
            _, res = _scan(run_residuals, kept["consts"], start, seg_fxs, size, f_rev,
                           fncarry)
            by_position = dict(zip(order, res))
            other = dict(zip(others, seg_others))
            xs = [by_position[from_forward[k]] if k in from_forward else other[k]
                  for k in xs_positions]
            return _scan(run_backward, consts, c, xs, size, b_rev, bncarry)

        carry_out, ys = jax.lax.scan(
            segment, list(carry),
            (kept["starts"], [_segments(x, segments) for x in kept["xs"]],
             [_segments(invals[k], segments) for k in others]), length=segments,
            reverse=b_rev)
        return list(carry_out) + [y.reshape(length, *y.shape[2:]) for y in ys]

    return forward, backward


def split_loops(closed: core.ClosedJaxpr, sizes: dict) -> core.ClosedJaxpr:
    """``closed`` with each pair of ``sizes`` (``LoopPair -> size``) run in
    segments of ``size`` iterations."""
    jaxpr = closed.jaxpr
    replaced = {}
    for pair, size in sizes.items():
        replaced[pair.forward], replaced[pair.backward] = _nested(jaxpr, pair, size)

    def run(*args):
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, args))
        read = lambda v: v.val if isinstance(v, core.Literal) else env[v]
        for i, eqn in enumerate(jaxpr.eqns):
            invals = [read(v) for v in eqn.invars]
            if i in replaced:
                outs = replaced[i](*invals)
            else:
                params = eqn.primitive.get_bind_params(eqn.params)
                with source_info_util.user_context(eqn.source_info.traceback,
                                                   name_stack=eqn.source_info.name_stack):
                    outs = eqn.primitive.bind(*invals, **params)
                if not eqn.primitive.multiple_results:
                    outs = [outs]
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    return jax.make_jaxpr(run)(*(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
                                 for v in jaxpr.invars))

"""Benchmark: the automatic pass inside a scanned transformer's train step.

A pre-LN transformer whose blocks run under ``lax.scan``, trained by an optax
Adam step (``jax.value_and_grad`` then ``opt.update``), planned by ``remat.jit``
at fractions of the plain program's temporaries (on top of its arguments and
outputs). Each row gives XLA's own figures of the planned program: footprint
against the limit, FLOPs ratio to the plain program (``cost_analysis()``),
median step-time ratio (steps timed in turn with the plain one), and what the
plan does in the loop; beside it, the hand-written body policy
(``jax.checkpoint`` on the block with ``nothing_saveable``,
``dots_with_no_batch_dims_saveable``, ``dots_saveable`` or
``save_only_these_names`` of the block's six matmuls) with the fewest FLOPs
among those XLA reads within the same limit.

With ``--groups G`` the layers run as nested scans: an outer scan over ``G``
groups whose body scans over the group's blocks (the hand policies then wrap
the inner block). With ``--microbatches M`` the step accumulates the gradient
over ``M`` microbatches in a ``lax.scan`` that is not differentiated, each
iteration a ``jax.value_and_grad`` of the scanned model (the pass plans inside
it, ``remat/_jax/loop_body.py``).

Run from the repository root: ``python -m bench.bench_loops`` (``--quick`` for
a small model). Writes ``bench/results/loops.md`` (``loops_nested.md`` with
``--groups``, ``loops_accumulated.md`` with ``--microbatches``; ``_quick`` with
``--quick``).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name

import remat
from bench.bench_auto import _median_times
from remat._jax.inline import inline_calls
from remat._jax.loops import jaxpr_flops
from bench.output import result_file

MATMULS = ("q", "k", "v", "attn_out", "ffn_in", "ffn_out")

POLICIES = {
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "dots_with_no_batch_dims_saveable":
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "save_only_these_names(matmuls)":
        jax.checkpoint_policies.save_only_these_names(*MATMULS),
}


def _norm(h):
    m = h.mean(-1, keepdims=True)
    return (h - m) * jax.lax.rsqrt(((h - m) ** 2).mean(-1, keepdims=True) + 1e-5)


def _block(heads):
    def block(x, p):
        b, s, d = x.shape
        split = lambda t: t.reshape(b, s, heads, d // heads)
        h = _norm(x)
        q = split(checkpoint_name(h @ p["wq"], "q"))
        k = split(checkpoint_name(h @ p["wk"], "k"))
        v = split(checkpoint_name(h @ p["wv"], "v"))
        a = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // heads), -1)
        o = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, s, d)
        x = x + checkpoint_name(o @ p["wo"], "attn_out")
        f = jax.nn.gelu(checkpoint_name(_norm(x) @ p["w1"], "ffn_in"))
        return x + checkpoint_name(f @ p["w2"], "ffn_out"), None
    return block


def train_step_for(layers, batch, seq, width, heads, policy=None, groups=1,
                   microbatches=1):
    """``(train_step, (params, opt_state, x))``; with ``policy``, the block is
    under ``jax.checkpoint`` with that policy; with ``groups > 1``, the blocks
    run in a scan over ``groups`` groups, each a scan over its blocks; with
    ``microbatches > 1``, the gradient is the mean over that many slices of the
    batch, accumulated in a scan."""
    if layers % groups:
        raise ValueError(f"train_step_for: groups={groups} must divide layers={layers}")
    keys = jax.random.split(jax.random.key(0), 7)
    shapes = {"wq": (width, width), "wk": (width, width), "wv": (width, width),
              "wo": (width, width), "w1": (width, 4 * width), "w2": (4 * width, width)}
    params = {n: jax.random.normal(k, (layers, *s)) / np.sqrt(s[0])
              for k, (n, s) in zip(keys, shapes.items())}
    x = jax.random.normal(keys[-1], (batch, seq, width))
    block = _block(heads)
    if policy is not None:
        block = jax.checkpoint(block, policy=policy)
    opt = optax.adam(1e-3)

    if groups > 1:
        params = jax.tree.map(lambda p: p.reshape(groups, layers // groups, *p.shape[1:]),
                              params)

    def run(x, params):
        if groups == 1:
            return jax.lax.scan(block, x, params)[0]
        group = lambda c, p: (jax.lax.scan(block, c, p)[0], None)
        return jax.lax.scan(group, x, params)[0]

    def loss(params, x):
        return jnp.mean(run(x, params) ** 2)

    def accumulated(params, x):
        xs = x.reshape(microbatches, x.shape[0] // microbatches, *x.shape[1:])

        def add(total, xm):
            value, grads = jax.value_and_grad(loss)(params, xm)
            return jax.tree.map(lambda t, g: t + g / microbatches, total,
                                (value, grads)), None
        zeros = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, params))
        return jax.lax.scan(add, zeros, xs)[0]

    def train_step(params, state, x):
        value, grads = (jax.value_and_grad(loss)(params, x) if microbatches == 1
                        else accumulated(params, x))
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    return train_step, (params, opt.init(params), x)


def _figures(compiled):
    m = compiled.memory_analysis()
    total = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes -
             m.alias_size_in_bytes)
    return total, compiled.cost_analysis()["flops"]


def _trip_flops(closed):
    """The op model's FLOPs of a program, each loop body times its trip count
    (XLA's ``cost_analysis()`` counts a loop body once)."""
    return jaxpr_flops(inline_calls(closed).jaxpr)


def _mib(n):
    return f"{n / 2**20:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model")
    parser.add_argument("--limits", default="0.75,0.5,0.3")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--groups", type=int, default=1,
                        help="run the layers as this many groups of nested scans")
    parser.add_argument("--microbatches", type=int, default=1,
                        help="accumulate the gradient over this many microbatches")
    args = parser.parse_args()
    sizes = (dict(layers=12, batch=2, seq=32, width=64, heads=4) if args.quick else
             dict(layers=12, batch=8, seq=128, width=256, heads=4))
    if args.groups > 1:
        sizes["groups"] = args.groups
    if args.microbatches > 1:
        sizes["microbatches"] = args.microbatches
    step, inputs = train_step_for(**sizes)
    plain = jax.jit(step).lower(*inputs).compile()
    base_total, base_flops = _figures(plain)
    base_trips = _trip_flops(jax.make_jaxpr(step)(*inputs))
    hand, hand_trips = {}, {}
    for name, policy in POLICIES.items():
        fn, _ = train_step_for(**sizes, policy=policy)
        compiled = jax.jit(fn).lower(*inputs).compile()
        hand[name] = (compiled, *_figures(compiled))
        hand_trips[name] = _trip_flops(jax.make_jaxpr(fn)(*inputs)) / base_trips
    want = jax.tree.leaves(plain(*inputs))
    lines = []
    for fraction in (float(f) for f in args.limits.split(",")):
        jitted = remat.jit(step, memory_limit=fraction)
        start = time.perf_counter()
        try:
            plan = jitted.plan_for(*inputs)
        except remat.MemoryLimitError as e:
            lines.append(f"| {fraction:.0%} | refused: {str(e)[:120]} | | | | | | | |"
                         " | | | |")
            continue
        seconds = time.perf_counter() - start
        got = jax.tree.leaves(plan.compiled(*inputs))
        same = all(np.allclose(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(got, want))
        total, flops = _figures(plan.compiled)
        fits = [(f, n) for n, (c, t, f) in hand.items() if t <= plan.limit_bytes]
        best = min(fits)[1] if fits else None
        fns = [plain, plan.compiled] + ([hand[best][0]] if best else [])
        times = _median_times(fns, inputs, args.rounds)
        ours = (f"{_mib(total)} | {flops / base_flops:.3f} | "
                f"{_trip_flops(plan.jaxpr) / base_trips:.3f} | {times[1] / times[0]:.2f}")
        theirs = ("none fits | | | |" if best is None else
                  f"{best}: {_mib(hand[best][1])} | {hand[best][2] / base_flops:.3f} | "
                  f"{hand_trips[best]:.3f} | {times[2] / times[0]:.2f}")
        stacked = "; ".join(f"{len(d.stacked)} stacked, {len(d.rebuilt)} rebuilt "
                            f"({len(d.recomputed)} ops)" for d in plan.loops)
        lines.append(f"| {fraction:.0%} ({_mib(plan.limit_bytes)}) | {ours} | "
                     f"{'yes' if plan.met else 'NO'} | {stacked} | {seconds:.0f} s | "
                     f"{'yes' if same else 'NO'} | {theirs} |")
        print(lines[-1], flush=True)
    hand_rows = "\n".join(f"| {n} | {_mib(t)} | {f / base_flops:.3f} | {hand_trips[n]:.3f} |"
                          for n, (c, t, f) in hand.items())
    text = (
        f"Device: {jax.default_backend()}, jax {jax.__version__}. Scanned pre-LN "
        f"transformer{' (nested scans)' if args.groups > 1 else ''} "
        f"train step (optax Adam"
        f"{', gradient accumulated in a scan' if args.microbatches > 1 else ''}): "
        f"{sizes}. Plain XLA footprint "
        f"{_mib(base_total)} MiB. Footprints in MiB (XLA's argument + output + temp - "
        f"alias); FLOPs and step time as ratios to the plain program (median of "
        f"{args.rounds} samples). FLOPs: XLA's `cost_analysis()`, which counts a loop "
        "body once; FLOPs x trips: the op model's count, each loop body times its trip "
        "count.\n\n"
        "| limit (MiB) | remat.jit footprint | FLOPs | FLOPs x trips | time | met | "
        "in the loop | plan+compiles | same outputs | best hand policy within the "
        "limit: footprint | FLOPs | FLOPs x trips | time |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n" +
        "\n".join(lines) + "\n\nHand-written body policies (jax.checkpoint on the "
        "block):\n\n| policy | footprint | FLOPs | FLOPs x trips |\n|---|---|---|---|\n" +
        hand_rows + "\n")
    name = ("loops_nested" if args.groups > 1 else
            "loops_accumulated" if args.microbatches > 1 else "loops")
    out = result_file(f"{name}_quick" if args.quick else name)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""Benchmark: the automatic pass on random programs nobody tuned it on.

For each program of :mod:`bench.random_programs` (seeds ``0 .. N-1``, or
``--first`` on), the training gradient ``jax.value_and_grad(loss)`` is measured
in XLA's own figures (``compile().memory_analysis()``: argument + output + temp -
alias bytes):

- **plain**: the program as written, and the seconds of one compile of it;
- **hand**: the program with each block, then each pair of consecutive blocks,
  under ``remat.checkpoint`` (the segmentations a user would write by hand);
- **hand limits met**: ``remat.plan`` with default settings at each hand
  footprint below the plain one, in bytes: the pass should reach what a user
  reaches by hand;
- **sweep**: ``remat.plan`` at the plain arguments and outputs plus a fraction of
  the plain temporaries (0.3 to 0.9, or 0.5 and 0.8 with ``--quick``);
- **least**: the least footprint of all the met plans (sweep and hand limits);
- **monotone**: over every limit tried (sweep and hand limits, in bytes), once a
  limit is met every higher one is met, with no more extra FLOPs;
- **vs optimal** (not with ``--quick``): the default's extra FLOPs over those of
  ``algorithm="optimal"`` at the lowest hand limit, where both meet it;
- **plan / compile**: ``Plan.plan_seconds`` (median over the program's plans) and
  the whole ``remat.plan`` call (median), each over one plain compile; the
  summary counts the met limits whose call took at most 3 plain compiles, and a
  section lists every call over that (its compiles, the column that answered).

Only the public API is used (``remat.plan``, ``remat.checkpoint``,
``remat.MemoryLimitError`` and the Plan's ``met``, ``planned``, ``extra_flops``,
``plan_seconds``, ``compiles``, ``algorithm``), so the benchmark measures
whatever pass the package holds.

Run from the repository root: ``python -m bench.bench_generalization [--seeds N]
[--first K] [--quick]``. Writes ``bench/results/generalization.md`` (one row per
program, the table rewritten after each program, so that a long run leaves its
rows so far) and prints the summary line.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import multiprocessing
import statistics
import time

import jax

import remat
from bench.output import result_file
from bench.random_programs import Program, random_program

#: The sweep's fractions of the plain temporaries.
FULL_FRACTIONS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
QUICK_FRACTIONS = (0.5, 0.8)
#: The hand segmentations: blocks per ``remat.checkpoint``.
SEGMENTS = (1, 2)
#: The issue's bound on a first call, in plain compiles (the attempts over it are
#: listed with what they compiled).
FIRST_CALL_FLOOR = 3.0
#: Relative slack when comparing extra FLOPs of two plans (float sums).
_FLOPS_RTOL = 1e-9

MiB = 2**20


def footprint(compiled) -> tuple[int, int]:
    """XLA's footprint of a compiled program and its temporaries, in bytes."""
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes, m.temp_size_in_bytes)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One ``remat.plan`` call at one limit."""
    label: str          # "0.5" (a fraction of the temporaries) or "hand1" (blocks)
    limit: int          # bytes
    met: bool
    planned: int | None         # XLA's footprint of the plan (None when refused)
    extra_flops: float | None
    plan_seconds: float | None
    wall_seconds: float
    error: str = ""
    compiles: int | None = None     # programs the search compiled (None when refused)
    planner: str = ""               # the column that planned the answer (Plan.algorithm)


def plan_at(program: Program, label: str, limit: int, **settings) -> Attempt:
    """``remat.plan`` of the program's gradient at ``limit`` bytes."""
    start = time.perf_counter()
    try:
        p = remat.plan(program.step, program.params, program.inputs,
                       memory_limit=int(limit), **settings)
    except remat.MemoryLimitError as e:
        return Attempt(label, limit, False, None, None, None,
                       time.perf_counter() - start, str(e))
    return Attempt(label, limit, bool(p.met), p.planned.total, float(p.extra_flops),
                   p.plan_seconds, time.perf_counter() - start, compiles=p.compiles,
                   planner=p.algorithm)


def monotone_violations(attempts: list[Attempt]) -> list[str]:
    """Where a higher limit does worse than a lower one: refused after a lower
    limit was met, or met with more extra FLOPs than a lower met limit."""
    out, best = [], None      # best: the met attempt with the least extra FLOPs so far
    for a in sorted(attempts, key=lambda a: a.limit):
        if best is not None and not a.met:
            out.append(f"{a.label} ({a.limit / MiB:.2f} MiB) refused though "
                       f"{best.label} ({best.limit / MiB:.2f} MiB) was met")
        elif best is not None and a.extra_flops > best.extra_flops * (1 + _FLOPS_RTOL):
            out.append(f"{a.label} ({a.limit / MiB:.2f} MiB) +{a.extra_flops / 1e6:.0f} "
                       f"MFLOP, more than {best.label} ({best.limit / MiB:.2f} MiB) "
                       f"+{best.extra_flops / 1e6:.0f} MFLOP")
        if a.met and (best is None or a.extra_flops <= best.extra_flops):
            best = a
    return out


@dataclasses.dataclass(frozen=True)
class Row:
    """Everything measured on one program (plain data, so that a worker process
    can send it back)."""
    name: str
    family: str
    blocks: int
    description: str
    plain: int
    temp: int
    compile_seconds: float
    hand: dict[int, int]              # blocks per checkpoint -> footprint
    attempts: list[Attempt]           # default settings: hand limits and the sweep
    optimal: Attempt | None           # algorithm="optimal" at the lowest hand limit

    @property
    def hand_attempts(self) -> list[Attempt]:
        return [a for a in self.attempts if a.label.startswith("hand")]

    @property
    def least(self) -> int | None:
        met = [a.planned for a in self.attempts if a.met]
        return min(met) if met else None

    @property
    def violations(self) -> list[str]:
        return monotone_violations(self.attempts)

    @property
    def optimal_ratio(self) -> float | None:
        """Default's extra FLOPs over optimal's at the same limit, where both met."""
        o = self.optimal
        mine = [a for a in self.hand_attempts if o is not None and a.limit == o.limit]
        if not (o and o.met and mine and mine[0].met):
            return None
        if o.extra_flops <= 0:
            return 1.0 if mine[0].extra_flops <= 0 else float("inf")
        return mine[0].extra_flops / o.extra_flops

    def time_ratios(self) -> tuple[float | None, float]:
        """Median plan_seconds (None when every limit was refused: a refusal has no
        Plan) and median remat.plan wall time, each over one plain compile."""
        plans = [a.plan_seconds for a in self.attempts if a.plan_seconds is not None]
        walls = [a.wall_seconds for a in self.attempts]
        plan = statistics.median(plans) / self.compile_seconds if plans else None
        return plan, statistics.median(walls) / self.compile_seconds


def measure(program: Program, fractions, with_optimal: bool) -> Row:
    """All the figures of one program (see the module docstring)."""
    args = (program.params, program.inputs)
    jax.clear_caches()
    lowered = jax.jit(program.step).lower(*args)
    start = time.perf_counter()
    plain, temp = footprint(lowered.compile())
    compile_seconds = time.perf_counter() - start
    hand = {k: footprint(jax.jit(jax.value_and_grad(program.segmented_loss(k)))
                         .lower(*args).compile())[0] for k in SEGMENTS}
    attempts = [plan_at(program, f"hand{k}", fp) for k, fp in hand.items()
                if fp < plain]
    fixed = plain - temp
    attempts += [plan_at(program, f"{f:.1f}", int(fixed + f * temp)) for f in fractions]
    optimal = None
    hand_limits = sorted(a.limit for a in attempts if a.label.startswith("hand"))
    if with_optimal and hand_limits:
        optimal = plan_at(program, "optimal", hand_limits[0], algorithm="optimal")
    return Row(program.name, program.family, len(program.blocks), program.description,
               plain, temp, compile_seconds, hand, attempts, optimal)


def measure_seed(seed: int, fractions, with_optimal: bool) -> Row:
    """:func:`measure` of the program of ``seed`` (a worker's task)."""
    return measure(random_program(seed), fractions, with_optimal)


# ------------------------------------------------------------------ report

def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MiB:.2f}"


def summary(rows: list[Row]) -> str:
    """The one-line summary the README shows."""
    hand = [a for r in rows for a in r.hand_attempts]
    monotone = sum(not r.violations for r in rows)
    ratios = [x for r in rows if (x := r.optimal_ratio) is not None]
    plan_ratio = [x for r in rows if (x := r.time_ratios()[0]) is not None]
    wall_ratio = [r.time_ratios()[1] for r in rows]
    least = [r.least / r.plain for r in rows if r.least is not None]
    text = (f"{len(rows)} programs: hand limits met {sum(a.met for a in hand)}/"
            f"{len(hand)}, monotone sweeps {monotone}/{len(rows)}, least footprint "
            f"reached median {statistics.median(least) if least else float('nan'):.2f}"
            f" of plain ({len(least)} with a met limit)")
    if ratios:
        text += (f", extra FLOPs vs optimal median {statistics.median(ratios):.2f}x, "
                 f"max {max(ratios):.2f}x ({len(ratios)} solved)")
    if plan_ratio:
        text += (f", planning / compile median {statistics.median(plan_ratio):.2f}x "
                 f"(max {max(plan_ratio):.2f}x)")
    met = [a for r in rows for a in r.attempts if a.met]
    within = sum(a.wall_seconds <= FIRST_CALL_FLOOR * r.compile_seconds
                 for r in rows for a in r.attempts if a.met)
    return text + (f", whole plan call / compile median "
                   f"{statistics.median(wall_ratio):.2f}x (max {max(wall_ratio):.2f}x), "
                   f"met limits planned within {FIRST_CALL_FLOOR:g}x {within}/{len(met)}")


def table(rows: list[Row], fractions) -> str:
    head = ("| program | family | blocks | plain MiB | temp MiB | hand 1/2 MiB | hand "
            "limits met | least MiB | " + " | ".join(fractions_label(fractions)) +
            " | monotone | vs optimal | plan/compile | call/compile |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        by_label = {a.label: a for a in r.attempts}
        sweep = [("met" if by_label[f"{f:.1f}"].met else "refused") for f in fractions]
        hand = r.hand_attempts
        ratio = r.optimal_ratio
        plan_ratio, wall_ratio = r.time_ratios()
        lines.append(
            f"| {r.name} | {r.family} | {r.blocks} | "
            f"{_mib(r.plain)} | {_mib(r.temp)} | "
            f"{' / '.join(_mib(r.hand[k]) for k in SEGMENTS)} | "
            f"{sum(a.met for a in hand)}/{len(hand)} | {_mib(r.least)} | "
            + " | ".join(sweep) + f" | {'yes' if not r.violations else 'NO'} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | "
            f"{'-' if plan_ratio is None else f'{plan_ratio:.2f}'} | "
            f"{wall_ratio:.2f} |")
    return "\n".join(lines)


def slow_calls(rows: list[Row]) -> str:
    """The attempts whose whole ``remat.plan`` call took over
    :data:`FIRST_CALL_FLOOR` plain compiles, slowest first: what they compiled,
    and what answered them."""
    slow = sorted(((a.wall_seconds / r.compile_seconds, r, a) for r in rows
                   for a in r.attempts if a.wall_seconds > FIRST_CALL_FLOOR * r.compile_seconds),
                  key=lambda t: -t[0])
    if not slow:
        return "None."
    lines = ["| program | limit | answer | compiles | plan/compile | call/compile |",
             "|---|---|---|---:|---:|---:|"]
    for ratio, r, a in slow:
        plan = "-" if a.plan_seconds is None else f"{a.plan_seconds / r.compile_seconds:.2f}"
        lines.append(f"| {r.name} | {a.label} | {a.planner if a.met else 'refused'} | "
                     f"{'-' if a.compiles is None else a.compiles} | {plan} | {ratio:.2f} |")
    return "\n".join(lines)


def fractions_label(fractions) -> list[str]:
    return [f"{f:.1f}" for f in fractions]


def failures(rows: list[Row]) -> list[str]:
    """One line per hand limit refused and per monotonicity violation."""
    out = []
    for r in rows:
        for a in r.hand_attempts:
            if not a.met:
                least = (a.error.split("the least reached is ")[-1].split(". ")[0]
                         if "the least reached is" in a.error else "?")
                out.append(f"- {r.name}: {a.label} limit {_mib(a.limit)} MiB "
                           f"(plain {_mib(r.plain)}) refused; least reached {least}")
        out += [f"- {r.name}: not monotone: {v}" for v in r.violations]
    return out


def write(rows: list[Row], fractions, flags: str) -> str:
    text = summary(rows)
    descriptions = "\n".join(f"- {r.name}: {r.description}" for r in rows)
    notes = failures(rows)
    result_file("generalization").write_text(
        "# Generalization: the automatic pass on random programs\n\n"
        f"`python -m bench.bench_generalization --seeds {len(rows)}"
        f"{flags}` ({jax.default_backend()}). Footprints are "
        "XLA's (argument + output + temp - alias), in MiB. Sweep columns: the plain "
        "arguments and outputs plus that fraction of the plain temporaries.\n\n"
        f"**{text}**\n\n" + table(rows, fractions) + "\n\n"
        "## Refused hand limits and monotonicity violations\n\n"
        + ("\n".join(notes) if notes else "None.") + "\n\n"
        f"## Calls over {FIRST_CALL_FLOOR:g}x a plain compile\n\n" + slow_calls(rows) + "\n\n"
        "## Programs\n\n" + descriptions + "\n")
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=50,
                        help="programs of seeds FIRST .. FIRST+N-1 (default 50)")
    parser.add_argument("--first", type=int, default=0,
                        help="the first seed (default 0): seeds past those the "
                             "pass was developed on test it on programs it has "
                             "never seen")
    parser.add_argument("--quick", action="store_true",
                        help=f"sweep {QUICK_FRACTIONS} instead of {FULL_FRACTIONS}, "
                             "and no comparison with the optimal algorithm")
    parser.add_argument("--optimal", action="store_true",
                        help="compare with the optimal algorithm under --quick too")
    parser.add_argument("--jobs", type=int, default=1,
                        help="programs measured at once, one process each (default 1; "
                             "timings are only comparable within one setting)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    if args.first < 0:
        parser.error(f"--first must be at least 0, got {args.first}")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    fractions = QUICK_FRACTIONS if args.quick else FULL_FRACTIONS
    task = functools.partial(measure_seed, fractions=fractions,
                             with_optimal=args.optimal or not args.quick)
    rows = []
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for r in pool.imap(task, range(args.first, args.first + args.seeds)):
            rows.append(r)
            print(f"{r.name}: plain {_mib(r.plain)} MiB, hand "
                  f"{'/'.join(_mib(r.hand[k]) for k in SEGMENTS)}, least "
                  f"{_mib(r.least)}, hand met {sum(a.met for a in r.hand_attempts)}/"
                  f"{len(r.hand_attempts)}, monotone {not r.violations}", flush=True)
            text = write(rows, fractions, f" --first {args.first}" * (args.first > 0) +
                         " --quick" * args.quick +
                         " --optimal" * (args.optimal and args.quick) +
                         f" --jobs {args.jobs}" * (args.jobs > 1))
    print(text)


if __name__ == "__main__":
    main()

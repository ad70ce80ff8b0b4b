"""remat.core.search: the search policy, with the compiler replaced by a rule.

The fake "compiler" reads a plan's footprint as its model peak plus a noise that
depends on the plan alone (as XLA's heap packing does): footprints are not
monotone in the planning target, which is what the search must survive.
"""

import dataclasses
import functools
import random

from hypothesis import given, settings, strategies as st

from remat.core.search import (MAX_COMPILES, MIN_SAVING, REFINES,
                               Candidate, Column, Frontier, Point, rungs)

PEAK, FLOOR = 1000, 300


def _column(name, seed, step=37, per_xla=1.0):
    """Plans come in steps of ``step`` model bytes (a target gives the plan of
    the step at or below it, none below the floor); each recomputes more the
    lower it goes."""
    def plan(target):
        peak = max(FLOOR, target - (target - FLOOR) % step)
        return Candidate((name, peak), peak, float(PEAK - peak) * (1 + seed % 3))
    return Column(name, rungs(FLOOR, PEAK), per_xla, lambda limit: int(limit * per_xla),
                  plan)


def _fake_compiler(seed, spread=120):
    """A plan's footprint: its model peak, then up to ``spread`` over or under it,
    decided by the plan alone; ``compiled`` counts the plans measured."""
    compiled = []

    def measure(cand):
        compiled.append(cand.key)
        noise = random.Random(hash((seed, cand.key))).randint(-spread // 3, spread)
        return Point(cand.key, cand.model_peak + noise, cand.extra_flops, "")
    return measure, compiled


def _frontier(seed, names=("a", "b")):
    measure, compiled = _fake_compiler(seed)
    plain = Point((), PEAK + 50, 0.0, "plain")
    columns = [_column(n, seed + k, step=23 + 14 * k) for k, n in enumerate(names)]
    return Frontier(columns, measure, plain), compiled


def _scaled_column(name, factor, rank=0):
    """A plan at every rung: at target t, peak t, recomputing ``factor * (PEAK - t)``."""
    return Column(name, rungs(FLOOR, PEAK), 1.0, lambda limit: limit,
                  lambda t: Candidate((name, t), t, factor * (PEAK - t)), rank=rank)


def test_each_plan_is_compiled_once():
    f, compiled = _frontier(0)
    for limit in (900, 700, 900, 500, 700, 1100):
        f.answer(limit)
    assert len(compiled) == len(set(compiled))
    assert f.answer(1100).key == ()            # the plain program meets it: no compile


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), order=st.permutations(list(range(250, 1100, 25))))
def test_answers_are_monotone_whatever_the_order_of_the_limits(seed, order):
    f, _ = _frontier(seed)
    for limit in order:
        f.answer(limit)
    # asked again, in any order: a higher limit never costs more or is refused
    answers = {limit: f.answer(limit) for limit in sorted(order)}
    met = [limit for limit, a in answers.items() if a is not None]
    assert met == sorted(order)[len(order) - len(met):]      # refused: only a prefix
    costs = [answers[limit].extra_flops for limit in met]
    assert costs == sorted(costs, reverse=True)
    for limit in met:
        assert answers[limit].footprint <= limit


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), low=st.integers(250, 1000), rise=st.integers(1, 300))
def test_a_fresh_search_meets_every_limit_above_one_met(seed, low, rise):
    lower, _ = _frontier(seed)
    higher, _ = _frontier(seed)
    if lower.answer(low) is not None:
        assert higher.answer(low + rise) is not None


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), limit=st.integers(250, 1000))
def test_a_portfolio_meets_what_any_of_its_columns_meets(seed, limit):
    alone = {}
    for name in ("a", "b"):
        measure, _ = _fake_compiler(seed)
        k = ("a", "b").index(name)
        col = _column(name, seed + k, step=23 + 14 * k)
        alone[name] = Frontier([col], measure).answer(limit)
    both, _ = _frontier(seed)
    if any(alone.values()):
        got = both.answer(limit)
        assert got is not None and got.footprint <= limit


def test_refused_only_when_every_rung_below_the_start_is_over():
    measure, compiled = _fake_compiler(1, spread=0)
    f = Frontier([_column("a", 0)], measure)
    assert f.answer(FLOOR - 1) is None
    # every rung at or below the start planned: here, the estimate is under the
    # floor, so the start is the lowest rung
    assert f.start(0, FLOOR - 1) == 0 and len(compiled) == 1
    assert f.answer(FLOOR).footprint == FLOOR      # the least reached is met


def test_a_search_stops_after_max_compiles_and_answers_with_what_it_compiled():
    # every plan reads 200 over its model peak: no limit under FLOOR + 200 is met,
    # and without a bound the search would compile every rung of both columns
    compiled = []

    def measure(cand):
        compiled.append(cand.key)
        return Point(cand.key, cand.model_peak + 200, cand.extra_flops, "")

    # (the model expects twice the limit: every walk starts near the top)
    columns = [_column(n, 0, step=1, per_xla=2.0) for n in ("a", "b")]
    f = Frontier(columns, measure)
    assert f.start(0, FLOOR + 150) + f.start(1, FLOOR + 150) + 2 > MAX_COMPILES
    assert f.answer(FLOOR + 150) is None and f.out_of_compiles
    assert len(compiled) == f.compiles == MAX_COMPILES
    # each limit has a bound of its own: the next one compiles what is left
    # (the rungs at or below its start not compiled yet), within its own bound
    assert f.answer(FLOOR + 160) is None and not f.out_of_compiles
    assert MAX_COMPILES < f.compiles < 2 * MAX_COMPILES
    # a limit met was not cut short
    assert f.answer(FLOOR + 200) is not None and not f.out_of_compiles
    # a rung the bound stopped before is compiled by a later search
    assert f.answer(FLOOR + 199) is None and f.exhausted
    assert len(set(compiled)) == 2 * len(columns[0].rungs)      # each rung compiled
    # unbounded, the same search compiles every rung before it refuses
    g = Frontier(columns, measure, max_compiles=10_000)
    assert g.answer(FLOOR + 150) is None and not g.out_of_compiles
    assert g.compiles == g.start(0, FLOOR + 150) + g.start(1, FLOOR + 150) + 2


def test_a_slow_columns_fill_ends_after_its_share_of_repeated_plans():
    # a solver below its reach answers every lower target with its plan of least
    # peak: in step 3 each such rung costs a solve and adds no point
    def slow_column(planned):
        def plan(target):
            planned.append(target)
            return Candidate(("least",), 600, 1.0)
        return Column("slow", rungs(FLOOR, PEAK), 1.0, lambda limit: limit, plan,
                      plans_quickly=False)

    limit, planned = FLOOR + 100, []
    measure, compiled = _fake_compiler(0, spread=0)
    f = Frontier([slow_column(planned)], measure, max_compiles=5)
    assert f.answer(limit) is None and not f.out_of_compiles
    assert compiled == [("least",)]
    # the walk: its start, then rung 0 (the miss, converted, is below the
    # floor); then the fill, to its share (5, the only column) of repeats
    assert len(planned) == 2 + 5
    assert f.untried == f.start(0, limit) + 1 - len(planned) > 0
    # a quick column's repeats cost no solve: its fill plans every rung
    planned = []
    g = Frontier([dataclasses.replace(slow_column(planned), plans_quickly=True)], measure,
                 max_compiles=5)
    assert g.answer(limit) is None and not g.out_of_compiles and g.untried == 0
    assert len(planned) == g.start(0, limit) + 1
    # a new plan is not a repeat: a solver that finds one at each rung is filled whole
    fresh = []
    h = Frontier([dataclasses.replace(slow_column(fresh), plan=lambda t: (
        fresh.append(t), Candidate(("at", t), 600, 1.0))[1])], measure, max_compiles=5)
    assert h.answer(limit) is None and h.untried == 0


def test_a_walk_stops_at_its_share_of_the_bound():
    # column "a" reads every plan 1 over the limit (its steps double: 1, 2, 4);
    # "b" meets it at its start: walked after a's share, not after the bound
    def measure(cand):
        name, peak = cand.key
        return Point(cand.key, 701 if name == "a" else peak, cand.extra_flops, "")

    planned = []

    def counted(column):
        def plan(target):
            planned.append(column.name)
            return column.plan(target)
        return dataclasses.replace(column, plan=plan)

    columns = [counted(_column("a", 0, step=1)),
               counted(_column("b", 0, step=1, per_xla=0.5))]
    f = Frontier(columns, measure, max_compiles=8)
    got = f.answer(700)
    assert got is not None and got.key[0] == "b"
    assert f.compiles == 8 // 2 + 2
    # a walk out of its share plans nothing more (a plan can cost a compile's
    # time) until every column had its turn; resumed then, its next rung
    # recomputes less than b's answer (by under MIN_SAVING: below its start a
    # walk compiles any plan that does) and misses, and the one after
    # recomputes more: planned, not compiled
    assert planned == ["a"] * 4 + ["b", "a", "a"]


def _a_meets_below_400(b_factor, b_rank=0):
    """Columns "a" (one rung per step, read at 800 above target 400, within
    below) and "b" (recomputing ``b_factor`` times a's at a target, read at
    its peak), and the compiler reading them."""
    a = dataclasses.replace(_scaled_column("a", 1.0), model_per_xla=0.01)

    def measure(cand):
        name, t = cand.key
        return Point(cand.key, 800 if name == "a" and t > 400 else t,
                     cand.extra_flops, "")
    return a, _scaled_column("b", b_factor, rank=b_rank), measure


def test_a_walk_cut_at_its_share_resumes_for_less_recompute():
    # "a" reads its plans over the limit down to 400 model bytes, then within;
    # "b" meets the limit at its start but recomputes 3x as much. a's walk runs
    # out of its share on the way down; resumed after b met the limit, it meets
    # it with less recompute, as a lower limit's walk of a would
    a, b, measure = _a_meets_below_400(3.0)
    f = Frontier([a, b], measure, max_compiles=20)
    got = f.answer(700)
    assert got is not None and got.key[0] == "a"
    assert f.compiles <= 20 and not f.out_of_compiles
    lower = Frontier([a, b], measure, max_compiles=20).answer(450)
    assert got.extra_flops <= lower.extra_flops


def test_a_cut_walk_resumes_after_an_answer_of_another_rank():
    # as above, but "b" is of another rank (another order): "a"'s cut walk,
    # not a new column, still resumes after b met the limit
    a, b, measure = _a_meets_below_400(3.0, b_rank=2)
    got = Frontier([a, b], measure, max_compiles=20).answer(700)
    assert got is not None and got.key[0] == "a"
    assert got.extra_flops <= Frontier([a, b], measure, max_compiles=20).answer(450).extra_flops


def test_a_resumed_walk_goes_on_as_a_lower_limits_walk_below_its_start():
    # as above, with a's walk cut sooner (its share: 4 plans), and "b"
    # recomputing less than 5% more than a's plan that meets:
    # below its start, a walk compiles any plan recomputing less than the
    # answer (MIN_SAVING is asked of its start only), resumed or not, so the
    # resumed walk of "a" answers, as a lower limit's walk of a does
    a, b, measure = _a_meets_below_400(2.1)
    got = Frontier([a, b], measure, max_compiles=8).answer(700)
    lower = Frontier([a, b], measure, max_compiles=8).answer(450)
    assert got.key[0] == lower.key[0] == "a"
    assert got.extra_flops <= lower.extra_flops


def test_a_walk_resumed_after_an_answer_steps_on_the_answers_terms():
    # "a" misses at its start and one rung below (820, 810: falling), meets two
    # rungs below; cut at its share (2 plans) its unbounded walk would step two
    # rungs (as far as the line through its misses, at most twice its step),
    # past the plan that meets, to one recomputing more than "b"'s answer.
    # Resumed once b met the limit, it steps as a walk bound by an answer does:
    # one rung where the footprint fell, and answers with less recompute.
    a = dataclasses.replace(_scaled_column("a", 1.0), model_per_xla=0.01)
    r, s = a.rungs, max(i for i, t in enumerate(a.rungs) if t <= 700)
    reads = {r[s]: 820, r[s - 1]: 810}
    b = _scaled_column("b", (PEAK - (r[s - 2] + r[s - 3]) / 2) / (PEAK - r[s]))

    def measure(cand):
        name, t = cand.key
        return Point(cand.key, reads.get(t, 700) if name == "a" else t,
                     cand.extra_flops, "")
    got = Frontier([a, b], measure, max_compiles=4).answer(700)
    assert got.key == ("a", r[s - 2])


def _two_zone_walk(limit, base_flops=PEAK):
    """The compiler reads every plan 100 over its model peak above 700, and 100
    under at or below it; the model targets the walk compiled, and its answer.
    A plan at target t recomputes ``base_flops - t``."""
    steps = []

    def measure(cand):
        steps.append(cand.model_peak)
        over = 100 if cand.model_peak > 700 else -100
        return Point(cand.key, cand.model_peak + over, cand.extra_flops, "")

    col = Column("a", rungs(FLOOR, PEAK), 1.0, lambda limit: limit,
                 lambda t: Candidate(t, t, float(base_flops - t)))
    return steps, Frontier([col], measure).answer(limit)


def test_a_miss_steps_down_by_the_miss_then_refines_back():
    # 781 reads 881: the walk steps down by the miss into the "under" zone (671
    # reads 571), refines at the rung the line through the two puts at the limit
    # (737, over), then halfway (693, within), then halfway again (715, over):
    # a gap of 5 rungs, bisected in three refines.
    steps, best = _two_zone_walk(790)
    assert steps[0] <= 790 and steps[1] < steps[0] - 90       # stepped by the miss
    assert len(steps) - 2 == 3 and max(steps[2:]) > steps[1]
    assert best.footprint <= 790 and best.extra_flops == min(
        PEAK - s for s in steps if s + (100 if s > 700 else -100) <= 790)
    assert best.footprint == 593                                # rung 693


def test_while_the_compiler_reads_the_walks_plans_flat_its_steps_double():
    # plans down to model target 500 read 701 to the byte (the compiler's peak
    # holds nothing they drop), those below it their model peak: the walk
    # steps 1, 2, 4 rungs and on, meets, and refines back up towards 500
    column = _scaled_column("a", 1.0)
    measure, compiled = _reading(set(), 0)

    def flat_above_500(cand):
        point = measure(cand)
        return point if cand.model_peak <= 500 else dataclasses.replace(point, footprint=701)
    f = Frontier([column], flat_above_500)
    got = f.answer(700)
    walked = [column.rungs.index(peak) for _, peak in compiled]
    start = f.start(0, 700)
    assert walked[:4] == [start, start - 1, start - 3, start - 7]
    assert got.footprint <= 700 and got.key[1] <= 500
    one_rung_at_a_time = start - max(k for k, t in enumerate(column.rungs) if t <= 500) + 1
    assert f.compiles < one_rung_at_a_time


def test_the_refines_after_a_widened_step_bisect_the_whole_gap():
    # plans above model target 480 read 701 (flat), those at or below it 100
    # under their peak: the walk steps 1, 2, 4, 8 rungs and meets 8 rungs below
    # its last miss; bisecting back up a gap of 8 takes three refines, more than
    # REFINES, and finds the highest rung within the limit
    column = _scaled_column("a", 1.0)
    compiled = []

    def measure(cand):
        compiled.append(cand.model_peak)
        footprint = 701 if cand.model_peak > 480 else cand.model_peak - 100
        return Point(cand.key, footprint, cand.extra_flops, "")
    got = Frontier([column], measure).answer(700)
    assert got.key[1] == max(t for t in column.rungs if t <= 480)
    assert len(compiled) - 5 > REFINES                          # the walk's 5, then 3


def test_after_two_misses_a_walk_steps_where_their_line_puts_the_limit():
    # footprints fall 1 byte per 4 model bytes, and the model's conversion of a
    # miss steps one rung at most (per_xla tiny): after the first miss one rung,
    # then at most twice the last step, and once the line through the last two
    # misses puts the limit nearer, there (6 rungs): it meets at the highest
    # rung within the limit, and the refines find none higher
    reading = {t: 900 + (t - 300) // 4 for t in rungs(FLOOR, PEAK)}
    column = dataclasses.replace(_scaled_column("a", 1.0), model_per_xla=1e-6)
    compiled = []

    def measure(cand):
        compiled.append(column.rungs.index(cand.model_peak))
        return Point(cand.key, reading[cand.model_peak], cand.extra_flops, "")
    f = Frontier([column], measure)
    got = f.answer(1000)
    start = f.start(0, 1000)
    assert compiled[:5] == [start, start - 1, start - 3, start - 7, start - 13]
    assert got.key[1] == max(t for t in column.rungs if reading[t] <= 1000)


def test_a_walk_bound_by_an_answer_steps_one_rung_where_the_footprint_falls():
    # plans read 10 over the limit falling a byte a rung, but one rung (two
    # below the start) is read within it: a walk looking for less recompute
    # than an answer (bounded) compiles every rung down to it; a walk while
    # nothing is known within the limit steps past it (the line through the
    # first two misses puts the limit far below: twice the last step)
    column = _scaled_column("a", 1.0)

    def frontier():
        start = Frontier([column], lambda c: None).start(0, 700)
        reading = {t: 710 + k - start for k, t in enumerate(column.rungs)}
        reading[column.rungs[start - 2]] = 690
        measured = []

        def measure(cand):
            measured.append(column.rungs.index(cand.model_peak))
            return Point(cand.key, reading[cand.model_peak], cand.extra_flops, "")
        return Frontier([column], measure), measured, start
    bounded, measured, start = frontier()
    assert bounded.walk(0, 700, bound=1e9)
    assert measured[:3] == [start, start - 1, start - 2]
    searching, measured, start = frontier()
    searching.walk(0, 700)
    assert measured[:3] == [start, start - 1, start - 3]


def test_no_refine_is_compiled_to_save_less_than_min_saving():
    # As above, but every plan recomputes about 9,300: the rungs the refines
    # would compile save under 1% of it, and none is compiled.
    steps, best = _two_zone_walk(790, base_flops=10 * PEAK)
    assert len(steps) == 2 and best.footprint == steps[1] - 100
    assert (10 * PEAK - steps[1]) * (1 - MIN_SAVING) < 10 * PEAK - max(
        r for r in rungs(FLOOR, PEAK) if r < steps[0])


def test_where_the_line_puts_no_rung_within_the_limit_the_walk_refines_halfway():
    # 846 reads 946; one step down by the miss, 737 reads 837: the line through
    # the two (read 100 over the model) puts the limit at 750, below the next
    # rung (759); halfway instead (781, over), then halfway again (759, over).
    steps, best = _two_zone_walk(850)
    assert steps == [846, 737, 781, 759] and best.footprint == 837


def test_a_flat_stretch_the_line_misses_is_found_halfway():
    # The compiler reads every plan at or below 800 at 820 (a flat stretch, as
    # when it packs a few more recomputed values into the same heap) and above
    # it 200 over. The line through the walk's miss and its first plan within
    # puts no rung between within the limit; halfway, a rung recomputing less
    # is, and the bisect goes on (a gap of 9 rungs: four refines) to the highest.
    steps = []

    def measure(cand):
        steps.append(cand.model_peak)
        return Point(cand.key, 820 if cand.model_peak <= 800 else cand.model_peak + 200,
                     cand.extra_flops, "")

    col = Column("a", rungs(FLOOR, PEAK), 1.0, lambda limit: limit,
                 lambda t: Candidate(t, t, float(PEAK - t)))
    best = Frontier([col], measure).answer(830)
    assert best.footprint == 820 and len(steps) == 2 + 4
    assert best.key == max(t for t in col.rungs if t <= 800)
    assert max(s for s in steps if s <= 800) > steps[1]      # above the first within


def test_a_rung_stepped_over_between_two_misses_is_compiled_if_it_saves():
    # Rungs 10..50; the start (50) reads 130 against 100: one step by the miss
    # to 20 (reads 105), one more to 10 (within). The compiler reads 40, which
    # the first step jumped over, within (95): it recomputes less, so the walk
    # compiles it (top down, with the refines left), not 30, which saves too
    # but lies below it.
    reads = {10: 90, 20: 105, 30: 120, 40: 95, 50: 130}
    steps = []

    def measure(cand):
        steps.append(cand.model_peak)
        return Point(cand.key, reads[cand.model_peak], cand.extra_flops, "")

    col = Column("a", (10, 20, 30, 40, 50), 1.0, lambda limit: 50,
                 lambda t: Candidate(t, t, 100.0 - t))
    best = Frontier([col], measure).answer(100)
    assert steps == [50, 20, 10, 40]
    assert (best.footprint, best.extra_flops) == (95, 60.0)


def test_a_column_that_cannot_recompute_less_than_the_answer_is_not_walked():
    # b plans the same peaks as a at twice the FLOPs: once a met the limit,
    # nothing of b is compiled; given first, b is walked, then a (whose start
    # plan recomputes less), which answers.
    seeds = {"a": 0, "b": 1}
    for names, walked in ((("a", "b"), {"a"}), (("b", "a"), {"a", "b"})):
        measure, compiled = _fake_compiler(2, spread=0)
        f = Frontier([_column(n, seeds[n]) for n in names], measure)
        assert f.answer(800).column == "a" and {k[0] for k in compiled} == walked


def _steep_and_flat():
    """Two columns over the same rungs: "steep" recomputes little at its start
    but the compiler reads its plans 150 over their model peak, so its walk ends
    low and dear; "flat" recomputes 400 at every rung and is read as planned."""
    def column(name, flops):
        return Column(name, rungs(FLOOR, PEAK), 1.0, lambda limit: limit,
                      lambda t: Candidate((name, t), t, flops(t)))

    steep = column("steep", lambda t: float(PEAK - t))
    flat = column("flat", lambda t: 400.0)
    compiled = []

    def measure(cand):
        compiled.append(cand.key)
        over = 150 if cand.key[0] == "steep" else 0
        return Point(cand.key, cand.model_peak + over, cand.extra_flops, "")
    return steep, flat, measure, compiled


def test_after_a_walk_met_a_column_is_walked_only_if_its_start_plan_recomputes_less():
    steep, flat, measure, compiled = _steep_and_flat()
    f = Frontier([flat, steep], measure)
    # flat meets 800 at its start (400); steep's start plan recomputes 200:
    # walked too, it meets the limit around 650 (recomputing 350) and answers
    got = f.answer(800)
    assert compiled[0][0] == "flat" and got.column == "steep"
    assert got.extra_flops < 400
    # at 600 steep's start plan (about 400) recomputes no less than flat's
    # answer: nothing of steep is compiled
    before = len(compiled)
    got = f.answer(600)
    assert got.column == "flat" and all(k[0] == "flat" for k in compiled[before:])


def test_after_a_walk_met_a_column_saving_a_sliver_at_its_start_is_not_walked():
    # "b" plans what "a" plans, recomputing a share less: walked after a met the
    # limit only when that share is at least MIN_SAVING.
    for saving, walked in ((MIN_SAVING / 2, False), (2 * MIN_SAVING, True)):
        compiled = []
        f = Frontier([_scaled_column("a", 1.0), _scaled_column("b", 1.0 - saving)],
                     lambda c: compiled.append(c.key) or Point(c.key, c.model_peak,
                                                                c.extra_flops, ""))
        assert f.answer(800).column == ("b" if walked else "a")
        assert any(k[0] == "b" for k in compiled) == walked


def test_a_slow_column_is_walked_only_when_no_quick_one_met():
    steep, flat, measure, compiled = _steep_and_flat()
    slow = dataclasses.replace(flat, name="slow", plans_quickly=False,
                               plan=lambda t: Candidate(("slow", t), t, 1.0))
    f = Frontier([steep, slow], measure)
    assert f.answer(800).column == "steep"
    assert not any(k[0] == "slow" for k in compiled)
    assert f.answer(FLOOR + 20).column == "slow"    # steep's least is FLOOR + 150


def test_the_answer_is_the_cheapest_known_within_the_limit():
    f, _ = _frontier(3)
    f.answer(400)
    f.answer(900)
    for limit in (400, 650, 900):
        got = f.answer(limit)
        within = [p for p in f.points.values() if p.footprint <= limit]
        assert got.extra_flops == min(p.extra_flops for p in within)


def test_at_equal_flops_the_lower_rank_answers():
    # Two columns plan the same targets at the same FLOPs; the second (rank 1,
    # e.g. a slower lowering) keeps fewer bytes, so it answers only limits the
    # first cannot meet.
    def column(name, rank, extra):
        return Column(name, rungs=(100, 200), model_per_xla=1.0,
                      estimate=lambda limit: limit, rank=rank,
                      plan=lambda t: Candidate((name, t), t, 300.0 - t, extra))

    f = Frontier([column("fast", 0, 50), column("lean", 1, 0)],
                 lambda c: Point(c.key, c.model_peak + c.payload, c.extra_flops, ""))
    assert f.answer(140).column == "lean"          # fast's least is 150
    # both rungs 100 are known within 150 at equal FLOPs: the lower rank answers
    assert f.answer(150).column == "fast"


def test_a_point_known_from_an_earlier_limit_bounds_the_walks():
    # After 600 is answered by flat (400 FLOPs), 800 walks steep only down to
    # plans recomputing less than 400, and never plans the slow column.
    steep, flat, measure, compiled = _steep_and_flat()
    planned = []
    slow = dataclasses.replace(
        flat, name="slow", plans_quickly=False,
        plan=lambda t: planned.append(t) or Candidate(("slow", t), t, 1.0))
    f = Frontier([flat, steep, slow], measure)
    assert f.answer(600).column == "flat"
    compiled.clear()
    got = f.answer(800)
    assert got.extra_flops <= 400 and got.footprint <= 800
    assert not planned and all(f.points[k].extra_flops < 400 for k in compiled)


def test_a_column_walked_after_another_rank_follows_its_answer():
    # "lean" plans what "fat" plans, read 100 lower (a lowering that keeps
    # fewer bytes, ranked after): once fat met the limit further down its
    # ladder, lean is walked too only where it names fat's rank.
    def column(name, rank, over, after=frozenset()):
        return Column(name, rungs(FLOOR, PEAK), 1.0, lambda limit: limit,
                      lambda t: Candidate((name, t), t, float(PEAK - t), over),
                      rank=rank, walked_after=after)

    measure = lambda c: Point(c.key, c.model_peak + c.payload, c.extra_flops, "")
    for after, column_answering in ((frozenset(), "fat"), (frozenset({0}), "lean")):
        f = Frontier([column("fat", 0, 150), column("lean", 1, 50, after)], measure)
        got = f.answer(800)
        assert got.footprint <= 800 and got.column == column_answering


def test_a_point_known_from_before_selects_the_columns_as_a_walk_that_met_does():
    # "other" (another order, rank 2) plans cheaper than "first" (rank 0).
    # Once first met 800, other is not walked; nor at 799, where first's answer
    # is known from before: a lower limit asked later gets no cheaper answer
    # than the higher one got (asked again, 800 keeps its answer too).
    compiled = []

    def measure(cand):
        compiled.append(cand.key[0])
        return Point(cand.key, cand.model_peak, cand.extra_flops, "")

    f = Frontier([_scaled_column("first", 2.0), _scaled_column("other", 1.0, rank=2)],
                 measure)
    high = f.answer(800)
    low = f.answer(799)
    assert high.column == low.column == "first" and "other" not in compiled
    assert low.extra_flops == high.extra_flops == f.answer(800).extra_flops


def test_a_point_known_from_a_later_column_leaves_the_earlier_ones_walked():
    # "first" cannot meet 600 (below 700 the compiler reads its plans 400 over);
    # "other" (rank 2, twice first's FLOPs) answers it. At 900 that answer is
    # known, but first comes before other: walked as a fresh search would, it
    # answers with less recompute.
    def measure(cand):
        over = 400 if cand.key[0] == "first" and cand.model_peak < 700 else 0
        return Point(cand.key, cand.model_peak + over, cand.extra_flops, "")

    f = Frontier([_scaled_column("first", 1.0), _scaled_column("other", 2.0, rank=2)],
                 measure)
    low = f.answer(600)
    assert low.column == "other"
    high = f.answer(900)
    assert high.column == "first" and high.extra_flops < low.extra_flops


def test_columns_that_plan_quickly_are_walked_before_slow_ones():
    # "slow" is given first, but "quick" is walked first and meets the limit, so
    # nothing of "slow" is planned (its plan may cost several compiles' time).
    planned = []

    def column(name, quick):
        def plan(t):
            planned.append(name)
            return Candidate((name, t), t, float(PEAK - t))
        return Column(name, rungs(FLOOR, PEAK), 1.0, lambda limit: limit, plan,
                      plans_quickly=quick)

    f = Frontier([column("slow", False), column("quick", True)],
                 lambda c: Point(c.key, c.model_peak, c.extra_flops, ""))
    assert f.answer(800).column == "quick" and "slow" not in planned


def _frontier_ahead(seed, names=("a", "b", "c"), spread=120):
    """A frontier of three columns whose ``compile_ahead`` records what it is
    given (and what it gives compiles nothing: ``measure`` still does)."""
    measure, compiled = _fake_compiler(seed, spread)
    ahead = []
    columns = [_column(n, seed + k, step=23 + 14 * k) for k, n in enumerate(names)]
    return (Frontier(columns, measure, Point((), PEAK + 50, 0.0, "plain"),
                     compile_ahead=lambda cand: ahead.append(cand.key)),
            compiled, ahead)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), limits=st.lists(st.integers(200, 1100), max_size=6))
def test_compiling_ahead_changes_no_answer(seed, limits):
    plain_frontier, plain_compiled = _frontier(seed, names=("a", "b", "c"))
    ahead_frontier, ahead_compiled, _ = _frontier_ahead(seed)
    for limit in limits:
        want, got = plain_frontier.answer(limit), ahead_frontier.answer(limit)
        assert (want is None) == (got is None)
        assert want is None or (want.key, want.footprint) == (got.key, got.footprint)
    assert ahead_compiled == plain_compiled     # the same plans measured, in order
    assert ahead_frontier.compiles == plain_frontier.compiles


def test_while_no_plan_is_within_each_compile_starts_the_next_columns_start():
    f, compiled, ahead = _frontier_ahead(3)
    limit = FLOOR - 100                 # below every floor: every walk fails
    f.answer(limit)
    assert {key[0] for key in compiled} == {"a", "b", "c"}
    assert set(compiled) <= set(ahead)  # each compile is started first
    b_start, c_start = (f.candidate(c, f.start(c, limit)).key for c in (1, 2))
    assert ahead[:2] == [compiled[0], b_start]
    # c's start was started beside b's walk, before c's walk compiled it
    assert ahead.count(c_start) >= 2


def test_once_a_plan_is_within_no_other_columns_start_is_compiled_ahead():
    f, compiled, ahead = _frontier_ahead(5, spread=0)   # footprint = model peak
    f.answer(PEAK)                      # the first plan meets it
    assert ahead[:2] == [compiled[0], f.candidate(1, f.start(1, PEAK)).key]
    # after it, each compile starts only itself (refines, walks for less recompute)
    assert all(k in compiled for k in ahead[2:])
    assert [k for k in ahead if k not in compiled] in ([], [ahead[1]])


def _window_column(name, window, rank=0, quick=True):
    """A plan at every rung (:func:`_window_compiler` reads them)."""
    return dataclasses.replace(_scaled_column(name, 1.0, rank=rank), plans_quickly=quick)


def _window_compiler(window):
    """Every plan read over the plain peak but those whose peak is in
    ``window``, read at their peak: a narrow stretch a step by the miss jumps
    over (a compiler whose footprint does not fall with the model's)."""
    compiled = []

    def measure(cand):
        compiled.append(cand.key)
        t = cand.model_peak
        return Point(cand.key, t if window[0] <= t <= window[1] else PEAK + 100,
                     cand.extra_flops, "")
    return measure, compiled


def test_before_a_slow_column_the_rungs_a_walk_stepped_over_are_compiled():
    targets = rungs(FLOOR, PEAK)
    limit = targets[-8]         # (the start: the walk steps from there by 300)
    window = (targets[-10], targets[-10])       # two rungs under the start
    measure, compiled = _window_compiler(window)
    slow = dataclasses.replace(_scaled_column("slow", 0.5), plans_quickly=False)
    f = Frontier([_window_column("quick", window), slow], measure)
    p = f.answer(limit)
    assert p is not None and p.column == "quick" and p.footprint == targets[-10]
    walked = [k[1] for k in compiled]
    assert walked[0] == targets[-8] and walked[1] < targets[-10]   # stepped over it
    assert walked[-2:] == [targets[-9], targets[-10]]              # then, from the top
    assert not any(k[0] == "slow" for k in compiled)               # no slow plan made


def test_only_the_first_rank_has_its_stepped_over_rungs_compiled_before_slow_ones():
    targets = rungs(FLOOR, PEAK)
    window = (targets[-10], targets[-10])
    measure, compiled = _window_compiler(window)

    def only_b(cand):           # only the rank-1 column's plans find the window
        p = measure(cand)
        return p if cand.key[0] == "b" else dataclasses.replace(p, footprint=PEAK + 100)

    slow = dataclasses.replace(_scaled_column("slow", 0.5), plans_quickly=False)
    f = Frontier([_window_column("a", window), _window_column("b", window, rank=1),
                  slow], only_b)
    assert f.answer(targets[-8]).key == ("b", targets[-10])
    first_slow = next(i for i, k in enumerate(compiled) if k[0] == "slow")
    assert compiled.index(("b", targets[-10])) > first_slow     # at step 3
    assert ("a", targets[-9]) in compiled[:first_slow]          # a's, at step 2b


def _reading(over, footprint):
    """A compiler reading the plans of the columns named in ``over`` at
    ``footprint``, the others at their model peak; and the keys it compiled."""
    compiled = []

    def measure(cand):
        compiled.append(cand.key)
        name, peak = cand.key
        return Point(cand.key, footprint if name in over else peak, cand.extra_flops, "")
    return measure, compiled


def test_a_last_resort_is_compiled_only_after_every_other_rung():
    # "c" plans what "b" plans for half the recompute, but as a last resort it
    # is not walked while no slow column answered, nor counted in the shares:
    # "a" (every plan read 1 over the limit) is still cut at half the bound,
    # then b meets it and answers. Where nothing else meets the limit, c's
    # rungs come after every other rung at or below its column's start (step 3)
    reading_over = functools.partial(_reading, footprint=701)
    last = dataclasses.replace(_column("c", 0, step=1, per_xla=0.5), last_resort=True)
    columns = [last, _column("a", 2, step=1), _column("b", 1, step=1, per_xla=0.5)]
    measure, compiled = reading_over({"a"})
    f = Frontier(columns, measure, max_compiles=8)
    assert f.answer(700).key[0] == "b" and all(k[0] != "c" for k in compiled)
    assert f.compiles == 8 // 2 + 1
    measure, compiled = reading_over({"a", "b"})
    f = Frontier(columns, measure, max_compiles=10_000)
    assert f.answer(700).key[0] == "c"
    first = next(i for i, k in enumerate(compiled) if k[0] == "c")
    others = {(n, f.columns[c].plan(f.columns[c].rungs[k]).key[1]) for c, n in [(1, "a"), (2, "b")]
              for k in range(f.start(c, 700) + 1)}
    assert others <= set(compiled[:first])


def test_after_a_slow_columns_answer_the_quick_last_resorts_are_walked():
    # "a" (quick) reads every plan over the limit; "slow" meets it recomputing
    # three times what the last resort "c" does for the same peak, so c's walk
    # (step 2d) answers. Where the quick column meets the limit, c is not walked.
    def column(name, factor, quick=True, last=False):
        return Column(name, rungs(FLOOR, PEAK), 1.0, lambda limit: limit,
                      lambda t: Candidate((name, t), t, factor * float(PEAK - t)),
                      plans_quickly=quick, last_resort=last)

    reading = functools.partial(_reading, footprint=10_000)
    columns = [column("a", 1.0), column("slow", 3.0, quick=False),
               column("c", 1.0, last=True)]
    measure, compiled = reading({"a"})
    answer = Frontier(columns, measure).answer(700)
    assert answer.column == "c" and answer.footprint <= 700
    assert any(k[0] == "slow" for k in compiled)
    measure, compiled = reading(set())
    assert Frontier(columns, measure).answer(700).column == "a"
    assert all(k[0] == "a" for k in compiled)


def test_a_twin_read_byte_for_byte_as_its_column_stops_its_walk():
    # "cond" compiles "gate"'s plans under another lowering. The compiler reads
    # gate's plans at 660 down to target 600 (it holds something no plan drops),
    # then at the target + 50: gate meets 650 below 600. Where the compiler
    # reads cond's plans alike, the lowering changes nothing at the peak: cond's
    # walk (bound by gate's answer) stops at its first plan, not compiling the
    # flat stretch again. Where it reads them otherwise (670, then 640 from
    # target 630 down: the lowering keeps fewer bytes there), cond walks on and
    # answers with less recompute.
    def reads(name, t, lowering_counts):
        if name == "cond" and lowering_counts:
            return 670 if t >= 630 else 640 if t >= 600 else t + 40
        return 660 if t >= 600 else t + 50

    for lowering_counts in (False, True):
        compiled = []

        def measure(cand, lowering_counts=lowering_counts):
            compiled.append(cand.key[0])
            return Point(cand.key, reads(*cand.key, lowering_counts), cand.extra_flops, "")

        gate = _scaled_column("gate", 1.0)
        cond = dataclasses.replace(_scaled_column("cond", 1.0, rank=1), twin_of="gate",
                                   walked_after=frozenset({0}))
        got = Frontier([gate, cond], measure, Point((), 1000, 0.0, "plain")).answer(650)
        assert got.footprint <= 650
        assert (compiled.count("cond") > 1) == lowering_counts, compiled
        assert (got.column == "cond") == lowering_counts


def test_a_twin_read_as_the_plain_program_walks_on():
    # As above, but the compiler reads gate's upper plans (and cond's, alike) at
    # the plain program's 700: those plans left its peak where it was, which
    # says nothing of the lowering. Below, cond reads its plans lower (the
    # target + 40 against + 50), and its walk, bound by gate's answer, finds one
    # within 650 that recomputes less.
    def reads(name, t):
        return 700 if t >= 640 else t + (40 if name == "cond" else 50)

    compiled = []

    def measure(cand):
        compiled.append(cand.key[0])
        return Point(cand.key, reads(*cand.key), cand.extra_flops, "")

    gate = dataclasses.replace(_scaled_column("gate", 1.0), model_per_xla=0.01)
    cond = dataclasses.replace(gate, name="cond", rank=1, twin_of="gate",
                               walked_after=frozenset({0}),
                               plan=lambda t: Candidate(("cond", t), t, PEAK - t))
    got = Frontier([gate, cond], measure, Point((), 700, 0.0, "plain")).answer(650)
    assert got.column == "cond" and got.footprint <= 650

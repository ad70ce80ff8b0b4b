"""remat.core.steps: where a walk goes next on its column's rungs."""

from hypothesis import given, strategies as st

from remat.core.steps import rung_below, rung_between, rungs_to_step

LADDER = tuple(range(100, 3300, 100))      # 32 rungs, 100 model bytes apart


def test_a_miss_steps_down_by_itself_in_model_bytes():
    # rung 20 (2100) read 300 over, two model bytes per compiled byte: 600 lower
    assert rung_below(LADDER, 20, peak=2100, footprint=1300, limit=1000,
                      model_per_xla=2.0, step=1) == 14
    # a plan below its rung steps from its own peak
    assert rung_below(LADDER, 20, peak=1800, footprint=1300, limit=1000,
                      model_per_xla=2.0, step=1) == 11


def test_a_small_miss_steps_the_rungs_asked_at_least():
    assert rung_below(LADDER, 20, peak=2100, footprint=1001, limit=1000,
                      model_per_xla=1.0, step=1) == 19
    assert rung_below(LADDER, 20, peak=2100, footprint=1001, limit=1000,
                      model_per_xla=1.0, step=4) == 16


def test_steps_after_two_misses():
    # first miss: one rung
    assert rungs_to_step(LADDER, 20, lo=1500, missed=None, hi=None, limit=1000,
                         bounded=False) == 1
    # the footprint did not fall over the last step of 3: twice it
    assert rungs_to_step(LADDER, 17, lo=1500, missed=20, hi=1500, limit=1000,
                         bounded=False) == 6
    # it fell 100 over 3 rungs (300 model bytes), 500 still over: the line puts
    # the limit 15 rungs lower, capped at twice the last step
    assert rungs_to_step(LADDER, 17, lo=1500, missed=20, hi=1600, limit=1000,
                         bounded=False) == 6
    # it fell 400 over 3 rungs, 100 over: the line puts the limit a rung lower
    assert rungs_to_step(LADDER, 17, lo=1100, missed=20, hi=1500, limit=1000,
                         bounded=False) == 1
    # bound by an answer, a walk that falls steps one rung at a time
    assert rungs_to_step(LADDER, 17, lo=1500, missed=20, hi=1600, limit=1000,
                         bounded=True) == 1


def test_a_refine_follows_the_line_or_the_middle():
    # met at rung 4 (500) read 900, missed at rung 12 (1300) read 1300: 1000 lies
    # a quarter of the way up, model 700
    assert rung_between(LADDER, met=4, lo=900, missed=12, hi=1300, limit=1000) == 6
    # no slope: the middle
    assert rung_between(LADDER, met=4, lo=1300, missed=12, hi=1300, limit=1000) == 8
    # the line puts the limit above the miss: the rung below it
    assert rung_between(LADDER, met=4, lo=900, missed=12, hi=1001, limit=1000) == 11


@given(k=st.integers(0, len(LADDER) - 1), peak=st.integers(1, 4000),
       over=st.integers(1, 5000), per=st.floats(0.1, 4.0), step=st.integers(1, 40))
def test_a_step_down_stays_on_the_ladder_and_goes_down(k, peak, over, per, step):
    got = rung_below(LADDER, k, peak=peak, footprint=1000 + over, limit=1000,
                     model_per_xla=per, step=step)
    assert 0 <= got <= max(k - step, 0)


@given(met=st.integers(0, len(LADDER) - 2), gap=st.integers(1, 30),
       lo=st.integers(0, 1000), rise=st.integers(-500, 3000))
def test_a_refine_stays_between_its_ends(met, gap, lo, rise):
    missed = min(met + gap, len(LADDER) - 1)
    got = rung_between(LADDER, met=met, lo=lo, missed=missed, hi=max(lo + rise, 1001),
                       limit=1000)
    assert met <= got < missed or got == met

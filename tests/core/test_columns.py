"""remat.core.columns: the ladder of model targets a column is asked at."""

from remat.core.columns import FINE_RUNGS, RUNGS, rungs

PEAK, FLOOR = 1000, 300


def test_rungs_span_floor_to_peak():
    r = rungs(FLOOR, PEAK)
    assert r[0] == FLOOR and r[-1] < PEAK and list(r) == sorted(r)
    assert len(r) == RUNGS + FINE_RUNGS - 1          # the floor is in both sets
    assert sum(x < r[0] + (PEAK - FLOOR) // RUNGS for x in r) == FINE_RUNGS
    assert rungs(500, 500) == (500,)


def test_a_peak_below_the_floor_gives_one_rung_at_the_peak():
    assert rungs(700, 500) == (500,)

"""The interval and verdict rule every signs-of-life finding is judged by (collective/intervals.py).

Properties over random tables (hypothesis), plus one coverage check: a 95% interval of normal
data covers the true mean about 95% of the time, so it is neither decoration nor a wild guess.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from collective.intervals import (
    MISSING,
    Interval,
    bootstrap,
    bootstrap_contrast,
    bootstrap_diff,
    bootstrap_fn,
    judge,
    verdict,
)

values = st.floats(-100, 100, allow_nan=False, allow_infinity=False)
tables = st.integers(1, 4).flatmap(
    lambda s: st.integers(1, 6).flatmap(
        lambda n: st.lists(st.lists(values, min_size=n, max_size=n), min_size=s, max_size=s)
    )
)


@settings(max_examples=40, deadline=None)
@given(tables)
def test_the_interval_holds_the_mean_and_stays_within_the_data(table: list[list[float]]) -> None:
    iv = bootstrap(table, boot=200)
    t = np.array(table)
    assert iv.mean is not None and iv.lo is not None and iv.hi is not None
    assert math.isclose(iv.mean, t.mean(), rel_tol=1e-9, abs_tol=1e-9)
    assert t.min() - 1e-9 <= iv.lo <= iv.mean <= iv.hi <= t.max() + 1e-9
    assert (iv.seeds, iv.instances) == t.shape


@settings(max_examples=30, deadline=None)
@given(tables, st.floats(-50, 50))
def test_shifting_the_data_shifts_the_interval(table: list[list[float]], c: float) -> None:
    a = bootstrap(table, boot=200)
    b = bootstrap(np.array(table) + c, boot=200)
    for x, y in ((a.mean, b.mean), (a.lo, b.lo), (a.hi, b.hi)):
        assert x is not None and y is not None
        assert math.isclose(x + c, y, rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), values)
def test_constant_data_has_a_point_interval(seeds: int, n: int, v: float) -> None:
    iv = bootstrap([[v] * n] * seeds, boot=100)
    assert iv.lo == iv.mean == iv.hi
    assert math.isclose(iv.mean, v, rel_tol=1e-12, abs_tol=1e-12)  # type: ignore[arg-type]


def test_missing_or_undefined_data_gives_a_missing_interval() -> None:
    assert bootstrap([]).missing and bootstrap([[1.0, float("nan")]]).missing
    assert bootstrap_fn(lambda r, c: None, 3, 3).missing
    # defined on the data but undefined on many resamples: no interval to bound it
    flaky = bootstrap_fn(lambda r, c: 1.0 if (c == np.arange(c.shape[1])).all() else None, 2, 5)
    assert flaky.mean == 1.0 and flaky.missing


def test_the_interval_is_reproducible_and_covers_the_truth_about_95_percent() -> None:
    t = [[0.1, 0.5, 0.9], [0.2, 0.4, 0.7]]
    assert bootstrap(t) == bootstrap(t)
    rng = np.random.default_rng(1)
    covered = 0
    for _ in range(200):
        iv = bootstrap(rng.normal(1.0, 1.0, (1, 40)), boot=400, rng_seed=int(rng.integers(1e9)))
        assert iv.lo is not None and iv.hi is not None
        covered += iv.lo <= 1.0 <= iv.hi
    assert 0.85 * 200 <= covered <= 0.99 * 200, covered
    # more seeds, more instances: narrower
    wide = bootstrap(rng.normal(0, 1, (2, 5)))
    narrow = bootstrap(rng.normal(0, 1, (8, 40)))
    assert narrow.hi - narrow.lo < wide.hi - wide.lo  # type: ignore[operator]


pairs = st.integers(1, 3).flatmap(
    lambda s: st.tuples(
        *(
            st.integers(1, 5).flatmap(
                lambda n: st.lists(st.lists(values, min_size=n, max_size=n), min_size=s, max_size=s)
            )
            for _ in range(2)
        )
    )
)


@settings(max_examples=40, deadline=None)
@given(pairs, st.floats(-50, 50))
def test_a_difference_holds_its_point_and_shifts_with_the_data(
    ab: tuple[list[list[float]], list[list[float]]], c: float
) -> None:
    a, b = ab
    d = bootstrap_diff(a, b, boot=200)
    assert d.mean is not None and d.lo is not None and d.hi is not None
    assert math.isclose(d.mean, np.mean(a) - np.mean(b), rel_tol=1e-9, abs_tol=1e-9)
    assert d.lo <= d.mean <= d.hi
    assert (d.seeds, d.instances) == (len(a), min(len(a[0]), len(b[0])))
    e = bootstrap_diff(np.array(a) + c, b, boot=200)
    for x, y in ((d.mean, e.mean), (d.lo, e.lo), (d.hi, e.hi)):
        assert x is not None and y is not None
        assert math.isclose(x + c, y, rel_tol=1e-9, abs_tol=1e-6)


def test_a_difference_draws_each_seed_once_for_both_tables() -> None:
    # Seeds that differ by 100 in both tables, instances by a little: the seed effect cancels in
    # the difference only if a resample takes the same seeds for a and for b.
    rng = np.random.default_rng(3)
    offset = np.array([[0.0], [100.0], [50.0]])
    a = offset + 1.0 + rng.normal(0, 0.1, (3, 12))
    b = offset + rng.normal(0, 0.1, (3, 7))
    d = bootstrap_diff(a, b)
    assert d.lo is not None and d.hi is not None
    assert 0.8 < d.lo <= d.hi < 1.2
    assert bootstrap_contrast([(1, a), (-1, b)]) == d  # a difference is a two-term contrast
    # (a - b) - (a - b) over four tables: the point is 0, and the seed effect cancels throughout
    four = bootstrap_contrast([(1, a), (-1, b), (-1, a), (1, b)])
    assert four.mean is not None and abs(four.mean) < 1e-12
    assert four.lo is not None and four.hi is not None
    assert -0.2 < four.lo <= 0 <= four.hi < 0.2
    # with one seed it is the two samples' own bootstrap: wider with fewer instances
    few = bootstrap_diff(a[:1, :3], b[:1, :3])
    assert few.hi - few.lo > d.hi - d.lo  # type: ignore[operator]


def test_a_difference_of_unmatched_or_undefined_tables_is_missing() -> None:
    assert bootstrap_diff([[1.0, 2.0]], [[1.0], [2.0]]).missing  # seeds do not match
    assert bootstrap_diff([], [[1.0]]).missing
    assert bootstrap_diff([[1.0, float("nan")]], [[1.0]]).missing
    assert bootstrap_diff([[1.0, 2.0]], [[0.5]]) == bootstrap_diff([[1.0, 2.0]], [[0.5]])


intervals = st.tuples(values, st.floats(0, 20), st.floats(0, 20)).map(
    lambda m: Interval(mean=m[0], lo=m[0] - m[1], hi=m[0] + m[2])
)
baselines = st.one_of(st.none(), values, intervals, st.just(MISSING))


@settings(max_examples=200, deadline=None)
@given(
    intervals, st.dictionaries(st.sampled_from(["random", "untrained"]), baselines), st.booleans()
)
def test_yes_only_when_the_interval_clears_every_baseline(
    x: Interval, bases: dict, above: bool
) -> None:
    v, why = judge(x, bases, above=above)
    assert v in ("yes", "no") and why
    if v == "yes":
        for b in bases.values():
            assert b is not None and not (isinstance(b, Interval) and b.missing)
            ref = (b.hi if above else b.lo) if isinstance(b, Interval) else b
            assert (x.lo > ref) if above else (x.hi < ref)  # type: ignore[operator]
    # never yes on a missing figure
    assert verdict(MISSING, bases, above=above) == "no"
    assert verdict(Interval(mean=x.mean, lo=None, hi=None), bases, above=above) == "no"


@settings(max_examples=100, deadline=None)
@given(intervals, values, st.floats(0.1, 50))
def test_a_better_figure_never_loses_a_yes(x: Interval, base: float, up: float) -> None:
    better = Interval(mean=x.mean + up, lo=x.lo + up, hi=x.hi + up)  # type: ignore[operator]
    if verdict(x, {"random": base}) == "yes":
        assert verdict(better, {"random": base}) == "yes"


def test_a_claim_with_a_size_needs_the_interval_beyond_it() -> None:
    x = Interval(mean=1.9, lo=1.4, hi=2.3)
    assert verdict(x, {"random": 1.0, "untrained": 1.1}) == "yes"
    v, why = judge(x, {"random": 1.0}, beyond=1.5)
    assert v == "no" and "1.5" in why
    assert verdict(x, {"random": Interval(mean=1.2, lo=1.0, hi=1.45)}) == "no"  # overlap

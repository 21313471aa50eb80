"""Means with 95% bootstrap intervals, for bench scripts' findings.

A small stand-in until a shared helper (``collective/intervals.py``, issue 16) lands on main:
percentile bootstrap over the independent units given (seeds, task instances), seeded so a
script prints the same interval twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RESAMPLES = 4000


def mean_ci(
    values: Sequence[float], level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its percentile-bootstrap interval. One value gives a
    zero-width interval (there is nothing to resample); none raises."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_ci: no values")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, (RESAMPLES, x.size))].mean(axis=1)
    a = (1.0 - level) / 2
    return float(x.mean()), float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def diff_ci(
    a: Sequence[float], b: Sequence[float], level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high), resampling the two independent samples separately."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        raise ValueError("diff_ci: a sample is empty")
    rng = np.random.default_rng(seed)
    d = x[rng.integers(0, x.size, (RESAMPLES, x.size))].mean(axis=1) - y[
        rng.integers(0, y.size, (RESAMPLES, y.size))
    ].mean(axis=1)
    q = (1.0 - level) / 2
    return float(x.mean() - y.mean()), float(np.quantile(d, q)), float(np.quantile(d, 1 - q))

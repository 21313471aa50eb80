"""Uncertainty for findings: bootstrap intervals over seeds and instances, and the verdict rule.

A figure of a trained collective varies with the training seed and with the task instances it
is evaluated on; one run on a dozen instances says little about either. ``bootstrap`` gives a
figure's mean and a percentile interval by resampling both levels (training seeds with
replacement, then each chosen seed's held-out instances with replacement), so a finding backed
by one lucky seed gets a wide interval. ``verdict`` is the one rule every finding is judged by:
"yes" only when the interval clears every baseline it is compared with (the random and the
untrained policy through the same protocol) and, where the claim has a size, clears that too;
"no" otherwise, and always "no" when the figure or a baseline is missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import msgspec
import numpy as np

LEVEL = 0.95
BOOT = 2000


class Interval(msgspec.Struct, kw_only=True):
    """A figure's point estimate and its bootstrap interval; None where it could not be had."""

    mean: float | None
    lo: float | None
    hi: float | None
    seeds: int = 0  # training seeds (rows) it was computed over
    instances: int = 0  # held-out instances per seed (columns)

    @property
    def missing(self) -> bool:
        return self.mean is None or self.lo is None or self.hi is None

    def text(self, fmt: str = ".2f") -> str:
        if self.missing:
            return "missing"
        return f"{self.mean:{fmt}} [{self.lo:{fmt}}, {self.hi:{fmt}}]"


MISSING = Interval(mean=None, lo=None, hi=None)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def bootstrap_fn(
    statistic: Callable[[np.ndarray, np.ndarray], float | None],
    seeds: int,
    instances: int,
    *,
    boot: int = BOOT,
    level: float = LEVEL,
    rng_seed: int = 0,
) -> Interval:
    """The interval of any statistic of a (seeds x instances) design. ``statistic(rows, cols)``
    gets row indices (shape [seeds]) and, for each, column indices (shape [seeds, instances]);
    it is first called with the identity (the point estimate), then ``boot`` times with
    resampled indices. A statistic that returns None or NaN for the data itself gives a missing
    interval; if it does so for more than the interval's tail mass of the resamples, the
    interval is missing too (the figure is not defined often enough to bound)."""
    if seeds < 1 or instances < 1:
        return Interval(mean=None, lo=None, hi=None, seeds=seeds, instances=instances)
    rows = np.arange(seeds)
    cols = np.tile(np.arange(instances), (seeds, 1))
    point = _finite(statistic(rows, cols))
    if point is None:
        return Interval(mean=None, lo=None, hi=None, seeds=seeds, instances=instances)
    rng = np.random.default_rng(rng_seed)
    values = []
    undefined = 0
    for _ in range(boot):
        r = rng.integers(0, seeds, seeds) if seeds > 1 else rows
        c = rng.integers(0, instances, (seeds, instances))
        v = _finite(statistic(r, c))
        if v is None:
            undefined += 1
        else:
            values.append(v)
    return _percentile(point, values, undefined, boot, level, seeds, instances)


def _percentile(
    point: float,
    values: list[float],
    undefined: int,
    boot: int,
    level: float,
    seeds: int,
    instances: int,
) -> Interval:
    tail = (1 - level) / 2
    if not values or undefined > tail * boot:
        return Interval(mean=point, lo=None, hi=None, seeds=seeds, instances=instances)
    lo, hi = np.quantile(values, [tail, 1 - tail])
    return Interval(
        mean=point,
        lo=min(float(lo), point),  # the percentile interval of a skewed statistic can miss
        hi=max(float(hi), point),  # its own point estimate; widen it to include it
        seeds=seeds,
        instances=instances,
    )


def bootstrap(
    table: Sequence[Sequence[float]] | np.ndarray,
    *,
    boot: int = BOOT,
    level: float = LEVEL,
    rng_seed: int = 0,
) -> Interval:
    """Mean and interval of a (seeds x instances) table of figures (one row per training seed,
    or one row for a policy that was not trained: random, untrained)."""
    t = np.asarray(table, dtype=np.float64)
    if t.ndim != 2 or t.size == 0 or not np.isfinite(t).all():
        return MISSING
    return bootstrap_fn(
        lambda r, c: float(t[r[:, None], c].mean()),
        t.shape[0],
        t.shape[1],
        boot=boot,
        level=level,
        rng_seed=rng_seed,
    )


def bootstrap_contrast(
    terms: Sequence[tuple[float, Sequence[Sequence[float]] | np.ndarray]],
    *,
    boot: int = BOOT,
    level: float = LEVEL,
    rng_seed: int = 0,
) -> Interval:
    """sum(w * mean(table)) over ``terms`` (weight, table) and its interval, for (seeds x
    instances) tables whose row i comes from the same training seed (the same policy deployed
    several ways) but whose instances are their own, so their counts may differ: each resample
    draws the seeds once for every table, then each table's instances on its own. ``instances``
    of the result is the smallest table's count."""
    ws = [float(w) for w, _ in terms]
    ts = [np.asarray(t, dtype=np.float64) for _, t in terms]
    if (
        not ts
        or any(t.ndim != 2 or t.size == 0 or not np.isfinite(t).all() for t in ts)
        or len({t.shape[0] for t in ts}) != 1
    ):
        return MISSING
    seeds = ts[0].shape[0]
    point = float(sum(w * t.mean() for w, t in zip(ws, ts, strict=True)))
    rng = np.random.default_rng(rng_seed)
    rows = np.arange(seeds)
    values = []
    for _ in range(boot):
        r = (rng.integers(0, seeds, seeds) if seeds > 1 else rows)[:, None]
        cols = [rng.integers(0, t.shape[1], (seeds, t.shape[1])) for t in ts]
        values.append(float(sum(w * t[r, c].mean() for w, t, c in zip(ws, ts, cols, strict=True))))
    return _percentile(point, values, 0, boot, level, seeds, min(t.shape[1] for t in ts))


def bootstrap_diff(
    a: Sequence[Sequence[float]] | np.ndarray,
    b: Sequence[Sequence[float]] | np.ndarray,
    *,
    boot: int = BOOT,
    level: float = LEVEL,
    rng_seed: int = 0,
) -> Interval:
    """mean(a) - mean(b): :func:`bootstrap_contrast` of two tables (seeds drawn once for both,
    instances on their own). Paired by instance too? Pass the per-instance differences to
    ``bootstrap``."""
    return bootstrap_contrast([(1.0, a), (-1.0, b)], boot=boot, level=level, rng_seed=rng_seed)


Baseline = Interval | float | None


def judge(
    measured: Interval,
    baselines: Mapping[str, Baseline],
    *,
    above: bool = True,
    beyond: float | None = None,
) -> tuple[str, str]:
    """The verdict ("yes" or "no") and why. ``above``: the finding says the figure is higher
    than the baselines (False: lower). The interval must clear each baseline entirely (its
    lower end above the baseline's upper end, or the other way round), and ``beyond``, when
    given, is the size the claim needs (e.g. 1.5 for "about twice"): the interval must clear it
    too. A missing figure or a missing baseline is a "no"."""
    if measured.missing:
        return "no", "the figure is missing"
    edge = measured.lo if above else measured.hi
    assert edge is not None
    for name, b in baselines.items():
        if b is None or (isinstance(b, Interval) and b.missing):
            return "no", f"the {name} baseline is missing"
        ref = (b.hi if above else b.lo) if isinstance(b, Interval) else float(b)
        assert ref is not None
        if not (edge > ref if above else edge < ref):
            side = "above" if above else "below"
            return "no", f"the interval is not wholly {side} the {name} baseline ({ref:.3g})"
    if beyond is not None and not (edge > beyond if above else edge < beyond):
        side = "above" if above else "below"
        return "no", f"the interval is not wholly {side} {beyond:g}, the claim's size"
    return "yes", "the interval clears every baseline" + (
        f" and {beyond:g}" if beyond is not None else ""
    )


def verdict(
    measured: Interval,
    baselines: Mapping[str, Baseline],
    *,
    above: bool = True,
    beyond: float | None = None,
) -> str:
    return judge(measured, baselines, above=above, beyond=beyond)[0]

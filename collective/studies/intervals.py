"""Uncertainty for findings: bootstrap intervals over seeds and instances, and the verdict rule.

A figure of a trained collective varies with the training seed and with the task instances it
is evaluated on; one run on a dozen instances says little about either. ``bootstrap`` gives a
figure's mean and a percentile interval by resampling both levels (training seeds with
replacement, then each chosen seed's held-out instances with replacement), so a finding backed
by one lucky seed gets a wide interval. ``verdict`` is the one rule every finding is judged by:
"yes" only when the interval clears every baseline it is compared with (the random and the
untrained policy through the same protocol) and, where the claim has a size, clears that too;
"no" otherwise, and always "no" when the figure or a baseline is missing.

That bootstrap, and that rule, do not hold with a few seeds: with 3 training seeds a "95%"
bootstrap over seeds x instances covers the truth well under 95% of the time when seeds differ
(bench/coverage.py; the table is in bench/results/coverage/README.md, and
tests/studies/test_intervals.py asserts it), and two intervals that must not overlap ignore that
trained and untrained share seeds and instances. The statistics findings are judged by instead:

- ``paired``: per-(seed, instance) differences, the trained policy against the same seed's
  untrained initial weights on the same instance, or against a baseline with no seed (random,
  scripted: one row, the same instances), so instance difficulty and seed cancel where they can.
- ``seed_interval``: the mean of per-seed values (one figure per training seed, over its
  instances) and its Student-t interval over seeds, the per-seed values reported with it. The
  seed is the unit that was replicated; a t-interval over S seed means is exact for normal
  seed effects and close to 95% in the simulations, with 3 seeds as with 6.
- ``hierarchical_bootstrap``: for any statistic of a seeds x instances design (a ratio, say),
  resampling seeds, then each chosen seed's instances, vectorised; its percentile interval is
  expanded for the few seeds (Hesterberg's expanded percentile: the tails taken at
  Phi(-sqrt(S/(S-1)) t_{S-1})), which brings it near 95% where seeds differ; where they do not
  it counts the instances' noise twice and is conservative.
  Findings are judged by the t-interval; this one is for statistics that are not a mean.
- ``t_test`` and ``holm``: a finding's two-sided p-value from its per-seed values (a finding
  with several parts takes the largest, an intersection-union test), and Holm's step-down
  correction over the primary findings named in advance: ``judge_tests`` says "yes" only when
  every part is on the claimed side and the adjusted p-value is below 5%.
- ``survival``: time-to-score with censoring (a run that never reached the score within its
  horizon is censored there): the Kaplan-Meier estimate, the restricted mean survival time up
  to the horizon (RMST: the area under the curve, which a censored run bounds honestly instead
  of counting as the horizon itself) and the censored fraction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import msgspec
import numpy as np

LEVEL = 0.95
BOOT = 2000


class Interval(msgspec.Struct, kw_only=True):
    """A figure's point estimate and its interval; None where it could not be had."""

    mean: float | None
    lo: float | None
    hi: float | None
    seeds: int = 0  # training seeds (rows) it was computed over
    instances: int = 0  # held-out instances per seed (columns)
    per_seed: list[float] = []  # the figure of each training seed (seed_interval)
    method: str = ""  # how the interval was had: "t over seeds", "hierarchical bootstrap", ...

    @property
    def missing(self) -> bool:
        return self.mean is None or self.lo is None or self.hi is None

    def text(self, fmt: str = ".2f") -> str:
        if self.missing:
            return "missing"
        return f"{self.mean:{fmt}} [{self.lo:{fmt}}, {self.hi:{fmt}}]"


MISSING = Interval(mean=None, lo=None, hi=None)


def interval_text(iv: Mapping[str, float | None], fmt: str = "+.3f", lone: str = "") -> str:
    """An interval as a study's summary JSON holds it (``mean``, ``lo``, ``hi``), for a table:
    ``n/a`` without a mean, the mean and ``lone`` without an interval (one seed)."""
    mean, lo, hi = iv["mean"], iv["lo"], iv["hi"]
    if mean is None:
        return "n/a"
    if lo is None or hi is None:
        return f"{mean:{fmt}}{lone}"
    return f"{mean:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


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
    seeds: int = ts[0].shape[0]
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


# -- statistics that hold with a few seeds ------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _ibeta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with ``df`` degrees of freedom (numpy has no t; scipy is not a
    dependency, and this is all it would be used for)."""
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    tail = 0.5 * _ibeta(df / 2.0, 0.5, df / (df + x * x))
    return 1.0 - tail if x > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on ``t_cdf``, to 1e-12 relative)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def seed_interval(per_seed: Sequence[float] | np.ndarray, *, level: float = LEVEL) -> Interval:
    """The mean of one figure per training seed and its Student-t interval over the seeds
    (df = seeds - 1). One seed has a mean and no interval; a non-finite value, none."""
    v = np.asarray(per_seed, dtype=np.float64).ravel()
    if v.size == 0 or not np.isfinite(v).all():
        return Interval(mean=None, lo=None, hi=None, seeds=int(v.size), method="t over seeds")
    mean = float(v.mean())
    lo = hi = None
    if v.size > 1:
        half = t_quantile(0.5 + level / 2, v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
        lo, hi = mean - half, mean + half
    return Interval(
        mean=mean,
        lo=lo,
        hi=hi,
        seeds=int(v.size),
        per_seed=v.tolist(),
        method="t over seeds",
    )


def paired(
    a: Sequence[Sequence[float]] | np.ndarray, b: Sequence[Sequence[float]] | np.ndarray
) -> np.ndarray:
    """Per-(seed, instance) differences a - b of two (seeds x instances) tables on the same
    instances: row s of ``b`` is the same seed's (its untrained initial weights, say), or ``b``
    has one row, a baseline with no seed (random, scripted), set against every seed's row.
    Raises ValueError on tables that do not pair."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or y.shape[1] != x.shape[1] or y.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"paired: tables of shapes {x.shape} and {y.shape} do not pair")
    return x - y


def paired_contrast(
    a: Sequence[Sequence[float]] | np.ndarray,
    b: Sequence[Sequence[float]] | np.ndarray,
    *,
    level: float = LEVEL,
) -> Interval:
    """mean(a - b), paired by seed and instance (:func:`paired`), with its t-interval over
    the seeds' mean differences; missing where the tables do not pair or hold a NaN."""
    try:
        d = paired(a, b)
    except ValueError:
        return MISSING
    if d.size == 0:
        return MISSING
    iv = seed_interval(d.mean(axis=1), level=level)
    iv.instances = d.shape[1]
    return iv


def t_test(per_seed: Sequence[float] | np.ndarray, null: float = 0.0) -> float | None:
    """The two-sided p-value of "the seeds' mean is ``null``" (one-sample t over the per-seed
    values). None with fewer than two seeds or a non-finite value; 0 or 1 when the seeds agree
    exactly (no spread: the mean is the null or it is not)."""
    v = np.asarray(per_seed, dtype=np.float64).ravel()
    if v.size < 2 or not np.isfinite(v).all():
        return None
    se = float(v.std(ddof=1)) / math.sqrt(v.size)
    gap = float(v.mean()) - null
    if se == 0.0:
        return 1.0 if gap == 0.0 else 0.0
    return min(1.0, 2.0 * (1.0 - t_cdf(abs(gap) / se, v.size - 1)))


def claim_p(parts: Sequence[tuple[Interval, float]], *, above: bool = True) -> float:
    """The p-value of a finding that holds only if each part's mean is beyond its null, on the
    claimed side (``above``: higher): the largest of the parts' two-sided t-test p-values, 1 for
    a part on the wrong side, missing, or with fewer than two seeds (an intersection-union
    test: valid at its level without a correction among its own parts)."""
    worst = 0.0 if parts else 1.0
    for iv, null in parts:
        p = None if iv.mean is None or len(iv.per_seed) < 2 else t_test(iv.per_seed, null)
        right_side = iv.mean is not None and (iv.mean > null if above else iv.mean < null)
        worst = max(worst, 1.0 if p is None or not right_side else p)
    return worst


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values over a family of findings named in advance: the
    i-th smallest of m is multiplied by m - i + 1, made monotone, capped at 1. A finding is
    significant at level alpha, with the family-wise error held at alpha, when its adjusted
    p-value is below alpha."""
    names = sorted(pvalues, key=lambda k: (pvalues[k], k))
    m = len(names)
    out: dict[str, float] = {}
    running = 0.0
    for i, name in enumerate(names):
        running = max(running, min(1.0, (m - i) * float(pvalues[name])))
        out[name] = running
    return out


def judge_tests(
    claims: Mapping[str, tuple[Sequence[tuple[Interval, float]], bool]], *, alpha: float = 0.05
) -> dict[str, tuple[str, float, float, str]]:
    """Verdicts of the primary findings, all at once: ``claims`` maps each finding's name to
    (parts, above), each part an interval with per-seed values (a paired contrast, or a figure
    against a size) and the null it must clear. Returns name -> (verdict, p, Holm-adjusted p,
    why): "yes" only when the adjusted p-value is below ``alpha``."""
    raw = {name: claim_p(parts, above=above) for name, (parts, above) in claims.items()}
    adjusted = holm(raw)
    out = {}
    for name, (parts, _) in claims.items():
        p, q = raw[name], adjusted[name]
        if any(len(iv.per_seed) < 2 for iv, _ in parts):
            why = "fewer than two training seeds: no interval over seeds"
        elif q < alpha:
            why = f"p = {p:.2g}, Holm-adjusted {q:.2g} < {alpha:g} over {len(claims)} findings"
        else:
            why = f"p = {p:.2g}, Holm-adjusted {q:.2g} >= {alpha:g} over {len(claims)} findings"
        out[name] = ("yes" if q < alpha else "no", p, q, why)
    return out


def hierarchical_bootstrap(
    table: Sequence[Sequence[float]] | np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
    *,
    boot: int = BOOT,
    level: float = LEVEL,
    rng_seed: int = 0,
    expand: bool = True,
) -> Interval:
    """The interval of a statistic of a (seeds x instances [x ...]) array, resampling seeds
    with replacement, then each chosen seed's instances with replacement, all ``boot``
    resamples at once. ``statistic`` maps a batch of resampled arrays (shape [boot, seeds,
    instances, ...]) to ``boot`` values (default: the mean). ``expand``: Hesterberg's expanded
    percentile interval, the tails taken at Phi(-sqrt(S/(S-1)) t_{S-1}) instead of (1 - level)
    / 2, for the few seeds (without it, 3 seeds cover far less: bench/results/coverage/)."""
    t = np.asarray(table, dtype=np.float64)
    if t.ndim < 2 or t.size == 0 or not np.isfinite(t).all():
        return MISSING
    stat = statistic or (lambda x: x.reshape(x.shape[0], -1).mean(axis=1))
    seeds, instances = t.shape[:2]
    point = _finite(float(stat(t[None])[0]))
    base = Interval(
        mean=point, lo=None, hi=None, seeds=seeds, instances=instances, method="hierarchical"
    )
    if point is None or seeds < 2:
        return base
    rng = np.random.default_rng(rng_seed)
    r = rng.integers(0, seeds, (boot, seeds))
    c = rng.integers(0, instances, (boot, seeds, instances))
    values = np.asarray(stat(t[r[:, :, None], c]), dtype=np.float64)
    values = values[np.isfinite(values)]
    tail = (1 - level) / 2
    if values.size < boot * (1 - tail):  # undefined too often to bound
        return base
    if expand:
        z = math.sqrt(seeds / (seeds - 1)) * t_quantile(1 - tail, seeds - 1)
        tail = 0.5 * math.erfc(z / math.sqrt(2))
    lo, hi = np.quantile(values, [tail, 1 - tail])
    base.lo, base.hi = min(float(lo), point), max(float(hi), point)
    base.method = "hierarchical bootstrap" + (", expanded percentile" if expand else "")
    return base


class Survival(msgspec.Struct, kw_only=True):
    """Time to reach a score, with censoring: ``times`` and ``survival`` are the Kaplan-Meier
    step function (the share not yet there just after each event time), ``rmst`` the restricted
    mean time up to ``tau`` (the area under it), ``censored`` the share of runs that never got
    there within their horizon."""

    n: int
    censored: float
    tau: float
    rmst: float
    times: list[float]
    survival: list[float]
    median: float | None  # the first time the estimate falls to 0.5 or below; None if it never


def survival(
    times: Sequence[float] | np.ndarray, reached: Sequence[bool] | np.ndarray, tau: float
) -> Survival:
    """Kaplan-Meier and the RMST up to ``tau`` of times to an event: ``reached[i]`` False means
    run i was censored at ``times[i]`` (it had not got there when it stopped). Past the last
    time the curve stays at its last value (the RMST does not extrapolate a fall)."""
    t = np.asarray(times, dtype=np.float64).ravel()
    e = np.asarray(reached, dtype=bool).ravel()
    if t.size == 0 or t.size != e.size or not np.isfinite(t).all() or (t < 0).any():
        raise ValueError("survival: times must be finite, >= 0 and one per run")
    if not math.isfinite(tau) or tau <= 0:
        raise ValueError(f"survival: tau must be finite and > 0, got {tau}")
    at, surv = [], []
    s = 1.0
    for u in np.unique(t[e]):
        at_risk = int((t >= u).sum())
        s *= 1.0 - int(((t == u) & e).sum()) / at_risk
        at.append(float(u))
        surv.append(s)
    area, prev_t, prev_s = 0.0, 0.0, 1.0
    for u, v in zip(at, surv, strict=True):
        if u >= tau:
            break
        area += prev_s * (u - prev_t)
        prev_t, prev_s = u, v
    area += prev_s * (tau - prev_t)
    median = next((u for u, v in zip(at, surv, strict=True) if v <= 0.5), None)
    return Survival(
        n=int(t.size),
        censored=float((~e).mean()),
        tau=float(tau),
        rmst=float(area),
        times=at,
        survival=surv,
        median=median,
    )

"""The study's figures from its measurements: a policy's mean over training seeds and its
t-interval (:func:`figure`), paired contrasts (:func:`contrast`, :func:`versus`), useful work
over the average rollout, the solo's restricted mean time, the training curves held out and as
trained; :func:`estimate` gathers every figure the findings and the report read
(:class:`Measured`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from collective.rl.train import bucket, load_config, read_metrics
from collective.studies.intervals import (
    Interval,
    bootstrap,
    bootstrap_fn,
    hierarchical_bootstrap,
    paired_contrast,
    seed_interval,
    survival,
)
from experiments.setting import EVAL_T
from experiments.signs_of_life.design import KINDS, LOOSE, SCRIPTS, kinds_of
from experiments.signs_of_life.measure import first_time
from experiments.signs_of_life.runs import limit_share, seed_of, snapshot_steps


def figure(table: np.ndarray) -> Interval:
    """A policy's held-out figure from its (rows x instances) table: with several training
    seeds, the mean of the per-seed means and its t-interval over seeds (the per-seed values
    with it); with one row (random, which has no seed, or a single seed) the bootstrap over its
    instances, so labelled."""
    t = np.asarray(table, dtype=float)
    if t.shape[0] > 1:
        iv = seed_interval(t.mean(axis=1))
        iv.instances = t.shape[1]
        return iv
    iv = bootstrap(t)
    iv.per_seed, iv.method = t.mean(axis=1).tolist(), "bootstrap over instances (one row)"
    return iv


def heldout_main_figures(ev: dict[str, np.ndarray]) -> dict[str, Interval]:
    """A policy's held-out score, talk and keys taught (as the trained policy's are shown)."""
    return {
        "score": mean_score(ev),
        "comm": figure(ev["comm"].mean(axis=1)),
        "taught": figure(ev["taught"].mean(axis=1)),
    }


def mean_score(ev: dict[str, np.ndarray]) -> Interval:
    """Held-out score, every team size alike: mean over teams per (seed, instance)."""
    return figure(ev["score"].mean(axis=1))


def contrast(
    a: np.ndarray, a_seeds: list[int], b: np.ndarray, b_seeds: list[int] | None
) -> Interval:
    """mean(a - b) paired by (seed, instance), over the seeds both have (``b_seeds`` None: a
    baseline with no seed, random, set against every seed), with its t-interval over seeds."""
    if b_seeds is not None:
        common = [s for s in a_seeds if s in b_seeds]
        a = a[[a_seeds.index(s) for s in common]]
        b = b[[b_seeds.index(s) for s in common]]
    return paired_contrast(a, b)


def useful_rel_seeds(ev: dict[str, np.ndarray], teams: tuple[int, ...], want: str) -> np.ndarray:
    """Per row (training seed): landed tokens per rollout of the ``want`` bucket over that
    seed's evaluation's average rollout (every team size on the same instances); NaN where
    nothing landed."""
    u = ev["useful"]  # seeds x teams x instances
    sel = [i for i, t in enumerate(teams) if bucket(t) == want]
    avg = u.mean(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(avg > 0, u[:, sel].mean(axis=(1, 2)) / np.where(avg > 0, avg, 1), np.nan)


def useful_rel(ev: dict[str, np.ndarray], teams: tuple[int, ...], want: str) -> Interval:
    """The ``want`` bucket's useful work over the average rollout: the t-interval over seeds of
    the per-seed ratios; one row (random), the bootstrap over its instances."""
    u = ev["useful"]
    if u.shape[0] > 1:
        return seed_interval(useful_rel_seeds(ev, teams, want))
    sel = [i for i, t in enumerate(teams) if bucket(t) == want]

    def stat(r: np.ndarray, c: np.ndarray) -> float | None:
        x = u[r[:, None, None], np.arange(u.shape[1])[None, :, None], c[:, None, :]]
        avg = x.mean()
        return float(x[:, sel].mean() / avg) if avg > 0 else None

    iv = bootstrap_fn(stat, u.shape[0], u.shape[2])
    iv.per_seed = useful_rel_seeds(ev, teams, want).tolist()
    iv.method = "bootstrap over instances (one row)"
    return iv


def versus(
    per_seed: np.ndarray, base: np.ndarray, seeds: list[int], base_seeds: list[int] | None
) -> Interval:
    """Per-seed values minus a baseline's, paired by seed (``base_seeds`` None: one value, a
    baseline with no seed), as a t-interval over seeds."""
    a, b = np.asarray(per_seed, float)[:, None], np.asarray(base, float)[:, None]
    return contrast(a, seeds, b, base_seeds)


def latency_seeds(lc: dict[str, Any]) -> dict[str, Any]:
    """Per row (training seed), from the curves of each (seed, instance): the time the
    collective takes to reach its own score at its limit on that instance, the time the solo
    takes to reach it (censored at the horizon when it never does within its token budget),
    the restricted mean of each (Kaplan-Meier to the horizon), their ratio, the share of solo
    times censored, and the largest lead the solo's mean curve has before the limit.
    Instances where the collective scored nothing have no time to reach and are left out."""
    grid, T, S = lc["grid"], lc["team"], lc["solo"]
    at = int(np.searchsorted(grid, lc["t_max"]))
    horizon = float(grid[-1])
    early = grid <= lc["t_max"]
    ratio, rmst_team, rmst_solo, censored, lead, used = [], [], [], [], [], []
    solo_times: list[float] = []
    solo_reached: list[bool] = []
    for team, solo in zip(T, S, strict=True):
        levels = team[:, at]
        ok = levels > 0
        t_team: list[float] = []
        t_solo: list[float] = []
        reached: list[bool] = []
        for tc, sc, level in zip(team[ok], solo[ok], levels[ok], strict=True):
            reach = first_time(grid, tc, level)
            assert reach is not None  # the collective reaches its own score by its limit
            t_team.append(reach)
            ts = first_time(grid, sc, level)
            t_solo.append(horizon if ts is None else ts)
            reached.append(ts is not None)
        used.append(int(ok.sum()))
        lead.append(float(np.max((solo.mean(0) - team.mean(0))[early])))
        if not t_team:
            ratio.append(np.nan)
            rmst_team.append(np.nan)
            rmst_solo.append(np.nan)
            censored.append(np.nan)
            continue
        km_team = survival(t_team, [True] * len(t_team), horizon)
        km_solo = survival(t_solo, reached, horizon)
        solo_times += t_solo
        solo_reached += reached
        rmst_team.append(km_team.rmst)
        rmst_solo.append(km_solo.rmst)
        ratio.append(km_solo.rmst / km_team.rmst if km_team.rmst > 0 else np.nan)
        censored.append(km_solo.censored)
    pooled = survival(solo_times, solo_reached, horizon) if solo_times else None
    return {
        "ratio": np.array(ratio),
        "rmst_team": np.array(rmst_team),
        "rmst_solo": np.array(rmst_solo),
        "censored": np.array(censored),
        "lead": np.array(lead),
        "instances_used": used,
        "solo_survival": pooled,
        "horizon": horizon,
    }


def latency_figures(lc: dict[str, Any]) -> dict[str, Any]:
    """The latency figures of one kind of policy: the collective's and the solo's score at the
    limit, the ratio of the solo's restricted mean time to the collective's score over the
    collective's (per seed; its t-interval over seeds), the censored share, the solo's largest
    early lead, and the pooled Kaplan-Meier of the solo's times."""
    grid, T, S = lc["grid"], lc["team"], lc["solo"]
    at = np.searchsorted(grid, lc["t_max"])
    per = latency_seeds(lc)

    km = per["solo_survival"]
    return {
        "collective_final": figure(T[:, :, at]),
        "solo_at_t_max": figure(S[:, :, at]),
        "time_ratio": seed_interval(per["ratio"]),
        "rmst_solo": seed_interval(per["rmst_solo"]),
        "rmst_collective": seed_interval(per["rmst_team"]),
        "solo_censored": float(np.nanmean(per["censored"]))
        if np.isfinite(per["censored"]).any()
        else None,
        "solo_early_lead": seed_interval(per["lead"]),
        "instances_used": per["instances_used"],
        "solo_kaplan_meier": None if km is None else msgspec.to_builtins(km),
        "per_seed": per,
    }


# -- training curves -------------------------------------------------------------------------


def curve_table(runs: list[Path], field: Callable[[Any], float | None]) -> np.ndarray:
    """seeds x steps of a metric (NaN where a step lacks it)."""
    rows = []
    for run in runs:
        vals = [field(m) for m in read_metrics(run)]
        rows.append([np.nan if v is None else v for v in vals])
    return np.array(rows, dtype=float)


def heldout_curve(
    runs: list[Path], got: dict[str, dict[str, Any]], teams: tuple[int, ...]
) -> dict[str, Any]:
    """The training curve read from saved checkpoints: step 0 (each seed's initial weights),
    every kept step, and the last, each evaluated on the same held-out instances at one limit
    (``EVAL_T``). Per metric, a seeds x points table and its per-point t-interval over seeds:
    the curve's findings compare its ends, not training steps at their own limits."""
    last = load_config(runs[0] / "config.toml").steps
    points = [(0, "untrained"), *((s, f"step{s}") for s in snapshot_steps(runs)), (last, "trained")]
    evs = [got[f"main|{kind}|{EVAL_T:g}"] for _, kind in points]
    tables = {
        "score": np.array([ev["score"].mean(axis=(1, 2)) for ev in evs]).T,
        "comm": np.array([ev["comm"].mean(axis=(1, 2)) for ev in evs]).T,
        "taught": np.array([ev["taught"].mean(axis=(1, 2)) for ev in evs]).T,
        "useful_rel_5-8": np.array([useful_rel_seeds(ev, teams, "5-8") for ev in evs]).T,
    }
    return {
        "steps": [s for s, _ in points],
        "eval_time_limit": EVAL_T,
        "tables": tables,
        "intervals": {
            k: [
                seed_interval(t[:, j]) if t.shape[0] > 1 else bootstrap(t[:, [j]].T)
                for j in range(t.shape[1])
            ]
            for k, t in tables.items()
        },
    }


def ends(table: np.ndarray) -> tuple[Interval, Interval]:
    """The first and the last 20% of training: each seed's mean over those steps, and their
    t-interval over seeds (one seed: the bootstrap over its steps, which are not independent
    instances; a note beside a finding, never its verdict)."""
    k = max(1, table.shape[1] // 5)

    def over(part: np.ndarray) -> Interval:
        if part.shape[0] > 1:
            with np.errstate(invalid="ignore"):
                return seed_interval(np.nanmean(part, axis=1))
        return bootstrap(part[:, np.isfinite(part).all(axis=0)])

    return over(table[:, :k]), over(table[:, -k:])


# -- a step's metrics, a figure as text -------------------------------------------------------


def landed_rel(m: Any, b: str) -> float | None:
    """A step's landed work of bucket ``b`` over its average (an older run's attempts)."""
    return (m.landed_rel if m.landed_rel else m.useful_rel).get(b)


def talk(m: Any) -> float:
    """A step's message and post tokens per agent-second (0 in an older run, which has none)."""
    return m.talk_per_agent_second


def shown(x: Interval | None) -> str:
    return "missing" if x is None else x.text()


def pct(x: float | None) -> str:
    return "missing" if x is None else f"{100 * x:.0f}%"


# -- every figure the findings and the report read ------------------------------------------


@dataclass
class Measured:
    """The study's figures, read from its measurements (``got``: :func:`measure_all`) and its
    runs' training metrics: what the findings are judged by and the report shows."""

    runs: dict[str, list[Path]]
    teams: tuple[int, ...]  # the main run's team sizes
    raw: dict[str, dict[str, dict[str, np.ndarray]]]  # run, kind: its evaluation at EVAL_T
    heldout: dict[str, dict[str, dict[str, Interval]]]  # run, kind, figure
    own_limit: Interval | None  # no_pressure's trained score at its own limit
    loose: dict[str, Any]  # what ended no_pressure's episodes, and its scores at LOOSE
    useful_h: dict[str, dict[str, Interval]]  # team bucket, kind: landed work / average
    talk_by_team: dict[str, dict[str, Interval]]  # team bucket, kind: talk per agent-second
    latency: dict[str, dict[str, Any]]  # kind: the latency curves
    lat: dict[str, dict[str, Any]]  # kind: the latency figures
    curves: dict[str, dict[str, np.ndarray]]  # the training steps' own curves
    hc: dict[str, Any]  # the held-out training curve

    @property
    def seeds_of(self) -> dict[str, list[int]]:
        return {name: [seed_of(r) for r in rs] for name, rs in self.runs.items()}

    def score(self, name: str, kind: str = "trained") -> np.ndarray:
        """Held-out score of a run's policy, seeds x instances (mean over team sizes)."""
        return self.raw[name][kind]["score"].mean(axis=1)

    def beats_baselines(self, name: str, key: str = "score") -> dict[str, tuple[Interval, float]]:
        """The trained policy of run ``name`` against its own untrained weights and random,
        paired by (seed, instance), on ``key`` averaged over team sizes."""
        raw, seeds = self.raw[name], self.seeds_of[name]
        tr = raw["trained"][key].mean(axis=1)
        return {
            "trained - untrained": (
                contrast(tr, seeds, raw["untrained"][key].mean(axis=1), seeds),
                0.0,
            ),
            "trained - random": (
                contrast(tr, seeds, raw["random"][key].mean(axis=1), seeds),
                0.0,
            ),
        }

    def along(self, key: str, fmt: str = ".3g") -> str:
        """The held-out curve of ``key`` from step 0 to the end, each point over seeds."""
        return ", ".join(
            f"step {s}: {iv.text(fmt)}"
            for s, iv in zip(self.hc["steps"], self.hc["intervals"][key], strict=True)
        )


def estimate(runs: dict[str, list[Path]], got: dict[str, dict[str, Any]]) -> Measured:
    """Every figure of the study, from its measurements and its runs' metrics."""
    teams = load_config(runs["main"][0] / "config.toml").worlds[0].team_sizes
    raw, heldout = heldout_figures(runs, got)
    own_limit, loose = no_pressure_figures(runs, got, raw, teams)
    buckets = list(dict.fromkeys(bucket(t) for t in teams))
    every = (*KINDS, *SCRIPTS)
    useful_h = {b: {k: useful_rel(raw["main"][k], teams, b) for k in every} for b in buckets}
    talk_by_team = {  # held-out message and post tokens per agent-second, by team size
        b: {
            k: figure(raw["main"][k]["comm"][:, [bucket(t) == b for t in teams]].mean(axis=1))
            for k in every
        }
        for b in buckets
    }
    latency = {k: got[f"latency|{k}"] for k in every}
    curves = {
        "useful_rel": {
            b: curve_table(runs["main"], functools.partial(landed_rel, b=b)) for b in buckets
        },
        "comm": {k: curve_table(r, talk) for k, r in runs.items()},
        "score": {k: curve_table(r, lambda m: m.score_mean) for k, r in runs.items()},
    }
    return Measured(
        runs=runs,
        teams=teams,
        raw=raw,
        heldout=heldout,
        own_limit=own_limit,
        loose=loose,
        useful_h=useful_h,
        talk_by_team=talk_by_team,
        latency=latency,
        lat={k: latency_figures(lc) for k, lc in latency.items()},
        curves=curves,
        hc=heldout_curve(runs["main"], got, teams),
    )


def heldout_figures(
    runs: dict[str, list[Path]], got: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, dict[str, np.ndarray]]], dict[str, dict[str, dict[str, Interval]]]]:
    """Each run's evaluations at EVAL_T by kind (``raw``) and their figures: an ablation of the
    main run's organisation and limit has the main run's baselines."""
    heldout: dict[str, dict[str, dict[str, Interval]]] = {}
    raw: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for name in runs:
        kinds = kinds_of(name)
        raw[name] = {k: got[f"{name}|{k}|{EVAL_T:g}"] for k in kinds}
        heldout[name] = {
            k: {
                "score": mean_score(ev),
                "comm": figure(ev["comm"].mean(axis=1)),
                "taught": figure(ev["taught"].mean(axis=1)),
                "useful_per_agent": figure(ev["useful_per_agent"].mean(axis=1)),
                # the same score's interval by resampling seeds, then instances (a check on
                # the t-interval; missing with one row)
                "score_hierarchical": hierarchical_bootstrap(ev["score"].mean(axis=1)),
            }
            for k, ev in raw[name].items()
        }
        print(f"[{name}] held-out: {heldout[name]['trained']['score'].text()}", flush=True)
    for name in ("per_agent", "no_pressure", "latency_penalty"):
        if name in raw:  # the main run's organisation and limit: the main run's baselines
            for k in ("random", "untrained"):
                heldout[name][k] = heldout["main"][k]
    return raw, heldout


def no_pressure_figures(
    runs: dict[str, list[Path]],
    got: dict[str, dict[str, Any]],
    raw: dict[str, dict[str, dict[str, np.ndarray]]],
    teams: tuple[int, ...],
) -> tuple[Interval | None, dict[str, Any]]:
    """The no-pressure run at its own limit (its baselines there too), and what ended its
    episodes, in training and held out at both limits; none without the run."""
    if "no_pressure" not in runs:
        return None, {}
    at_own = {k: got[f"no_pressure|{k}|{LOOSE:g}"] for k in KINDS}
    own_limit = mean_score(at_own["trained"])
    share = {
        f"heldout_at_{lim:g}s": {
            k: {
                "share_at_limit": float(ev["at_limit"].mean()),
                "share_task_done": float(ev["done"].mean()),
                "at_limit_by_team": dict(
                    zip(map(str, teams), ev["at_limit"].mean(axis=(0, 2)).tolist(), strict=True)
                ),
            }
            for k, ev in evs.items()
        }
        for lim, evs in (
            (LOOSE, at_own),
            (EVAL_T, {"trained": raw["no_pressure"]["trained"], **raw["main"]}),
        )
    }
    loose = {
        "limit": LOOSE,
        "main_limit": EVAL_T,
        "training": limit_share(runs["no_pressure"]),
        **share,
        "score_at_own_limit": {k: mean_score(ev) for k, ev in at_own.items()},
    }
    print(f"[no_pressure] at {LOOSE:g} s: {own_limit.text()}", flush=True)
    return own_limit, loose

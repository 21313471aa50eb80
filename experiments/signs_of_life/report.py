"""The study's report in its ``--out``: the figures (:func:`plots`), summary.json
(:func:`summary`) and README.md (:func:`write_readme`), each verdict printed (:func:`report`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from collective.rl.train import read_metrics
from collective.studies.intervals import (
    Interval,
)
from experiments.setting import EVAL_T
from experiments.signs_of_life.design import CONTROLS, KINDS, LOOSE
from experiments.signs_of_life.estimates import Measured, pct
from experiments.signs_of_life.judge import PRIMARY, SECONDARY
from experiments.signs_of_life.runs import cpu_seconds, frozen_check

# -- figures ------------------------------------------------------------------------------------


def _band(ax: Any, x: np.ndarray, table: np.ndarray, label: str, **kw: Any) -> None:
    m = np.nanmean(table, 0)
    ax.plot(x, m, label=label, **kw)
    if table.shape[0] > 1:
        ax.fill_between(x, np.nanmin(table, 0), np.nanmax(table, 0), alpha=0.2, **kw)


def plots(out: Path, m: Measured) -> list[str]:
    """Every figure of the study, written to ``out``: their file names, in the report's order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for name, draw in (
        ("training_curve.png", _training_curve),
        ("useful_work.png", _useful_work),
        ("communication_and_score.png", _communication_and_score),
        ("latency.png", _latency),
        ("ablations.png", _ablations),
    ):
        fig = draw(plt, m)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(name)
    return files


def _training_curve(plt: Any, m: Measured) -> Any:
    hc = m.hc
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, label) in zip(
        axes,
        (
            ("score", "held-out score"),
            ("comm", "message + post tokens per agent-second"),
            ("useful_rel_5-8", "landed work, team 5-8 / average rollout"),
        ),
        strict=True,
    ):
        _band(ax, np.array(hc["steps"]), hc["tables"][key], "trained, per checkpoint")
        ax.set(xlabel="training step (checkpoint; band: min-max over seeds)", ylabel=label)
    axes[2].axhline(1.0, color="grey", ls=":")
    axes[1].set_title(f"0. The training curve, held-out at {EVAL_T:g} s from saved checkpoints")
    return fig


def _useful_work(plt: Any, m: Measured) -> Any:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for b, table in m.curves["useful_rel"].items():
        _band(axes[0], np.arange(table.shape[1]), table, b)
    axes[0].axhline(1.0, color="grey", ls=":")
    axes[0].set(
        xlabel="training step (main run; band: min-max over seeds)",
        ylabel="landed work tokens per rollout / this step's average",
        title="1a. Useful work by team size, training",
    )
    axes[0].legend(title="team")
    xs = np.arange(len(KINDS))
    for j, (b, per) in enumerate(m.useful_h.items()):
        mean = [per[k].mean or 0 for k in KINDS]
        err = [
            [max(0, (per[k].mean or 0) - (per[k].lo or 0)) for k in KINDS],
            [max(0, (per[k].hi or 0) - (per[k].mean or 0)) for k in KINDS],
        ]
        axes[1].bar(xs + j * 0.15, mean, 0.15, yerr=err, label=b)
    axes[1].set_xticks(xs + 0.3, KINDS)
    axes[1].axhline(1.0, color="grey", ls=":")
    axes[1].set(
        ylabel="landed work tokens / the evaluation's average rollout",
        title=f"1b. Held-out, T={EVAL_T:g} s (95% intervals)",
    )
    axes[1].legend(title="team", fontsize=8)
    return fig


def _communication_and_score(plt: Any, m: Measured) -> Any:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, table in m.curves["comm"].items():
        _band(axes[0], np.arange(table.shape[1]), table, name)
    for name, table in m.curves["score"].items():
        _band(axes[1], np.arange(table.shape[1]), table, name)
    held = m.heldout
    for k, ls in (("random", ":"), ("untrained", "--")):
        axes[0].axhline(held["main"][k]["comm"].mean or 0, color="k", ls=ls, label=f"{k}, held-out")
        axes[1].axhline(
            held["main"][k]["score"].mean or 0, color="k", ls=ls, label=f"{k}, held-out"
        )
    axes[0].set(
        xlabel="training step",
        ylabel="message and post tokens / agent-second",
        title="2a. Communication",
    )
    axes[1].set(
        xlabel="training step", ylabel="mean score (own limit)", title="2b. Score, training"
    )
    for a in axes:
        a.legend(fontsize=7)
    return fig


def _latency(plt: Any, m: Measured) -> Any:
    fig, ax = plt.subplots(figsize=(7, 4))
    for c, (kind, lc) in enumerate(m.latency.items()):
        g = lc["grid"] / 60
        ax.plot(g, lc["team"].mean((0, 1)), color=f"C{c}", label=f"collective of 8, {kind}")
        ax.plot(g, lc["solo"].mean((0, 1)), color=f"C{c}", ls="--", label=f"solo, {kind}")
    ax.axvline(EVAL_T / 60, color="grey", ls=":")
    ax.set(xlabel="simulated minutes", ylabel="mean score", title="3. Score against latency")
    ax.legend(fontsize=7)
    return fig


def _ablations(plt: Any, m: Measured) -> Any:
    fig, ax = plt.subplots(figsize=(10, 4))
    rows = {n: {k: d["score"] for k, d in per.items()} for n, per in m.heldout.items()}
    if m.loose.get("score_at_own_limit"):
        rows[f"no_pressure\nat {LOOSE:g} s"] = m.loose["score_at_own_limit"]
    names = list(rows)
    for j, kind in enumerate(KINDS):
        ivs = [rows[n][kind] for n in names]
        mean = [iv.mean or 0 for iv in ivs]
        err = [
            [max(0, (iv.mean or 0) - (iv.lo or 0)) for iv in ivs],
            [max(0, (iv.hi or 0) - (iv.mean or 0)) for iv in ivs],
        ]
        ax.bar(np.arange(len(names)) + j * 0.27, mean, 0.27, yerr=err, label=kind)
    ax.set_xticks(np.arange(len(names)) + 0.27, names, rotation=15, fontsize=8)
    ax.set(
        ylabel=f"held-out mean score, T={EVAL_T:g} s unless named",
        title="4. Ablations and organisations, each beside its own baselines (95% intervals)",
    )
    ax.legend()
    return fig


# -- summary.json -------------------------------------------------------------------------------


def _iv(x: Interval) -> Any:
    return msgspec.to_builtins(x)


@dataclass
class Study:
    """How the study was run, as summary.json and the README say it."""

    quick: bool
    t0: float  # when it started (time.perf_counter)
    train_seconds: float
    jobs: int
    seeds: list[int]
    complete_only: bool
    instances: int
    specs: dict[str, dict[str, Any]]  # every variant asked for


def summary(
    m: Measured, found: list[dict[str, Any]], figures: list[str], study: Study
) -> dict[str, Any]:
    """summary.json: how the study was run, the findings and every figure behind them, the
    files, the settings and every run's metrics."""
    return {
        "quick": study.quick,
        "wall_seconds": time.perf_counter() - study.t0,
        "train_seconds": study.train_seconds,
        "cpu_seconds": cpu_seconds(),  # this process and its training children, user + system
        "jobs": study.jobs,
        "seeds": study.seeds,
        "complete_only": study.complete_only,
        "seeds_by_run": m.seeds_of,
        "instances": study.instances,
        "eval_time_limit": EVAL_T,
        "findings": found,
        **_figures(m),
        "statistics": STATISTICS,
        "latency_curves": {
            k: {
                "grid": lc["grid"][::8].tolist(),
                "collective": lc["team"].mean((0, 1))[::8].tolist(),
                "solo": lc["solo"].mean((0, 1))[::8].tolist(),
            }
            for k, lc in m.latency.items()
        },
        "figures": figures,
        "settings": {
            n_: {k: (v if isinstance(v, int | float | str) else str(v)) for k, v in f.items()}
            for n_, f in study.specs.items()
            if n_ in m.runs
        },
        "metrics": {
            r.name: [msgspec.to_builtins(x) for x in read_metrics(r)]
            for rs in m.runs.values()
            for r in rs
        },
    }


def _figures(m: Measured) -> dict[str, Any]:
    """The held-out figures of summary.json, from the training curve to the latency."""
    runs, loose = m.runs, m.loose
    binding = {}
    for name, rs in runs.items():
        tail = [x for r in rs for x in read_metrics(r)[-max(1, len(read_metrics(r)) // 5) :]]
        binding[name] = float(np.mean([x.duration_mean / x.time_limit for x in tail]))
    return {
        "training_curve_heldout": {
            "steps": m.hc["steps"],
            "eval_time_limit": EVAL_T,
            "per_metric": {k: [_iv(x) for x in ivs] for k, ivs in m.hc["intervals"].items()},
        },
        "heldout": {
            name: {k: {f: _iv(x) for f, x in d.items()} for k, d in per.items()}
            for name, per in m.heldout.items()
        },
        "no_pressure_at_own_limit": _iv(m.own_limit) if m.own_limit else None,
        "no_pressure_limit": {
            **loose,
            "score_at_own_limit": {k: _iv(x) for k, x in loose["score_at_own_limit"].items()},
        }
        if loose
        else None,
        "orchestrator_frozen": frozen_check(runs["orchestrator"])
        if "orchestrator" in runs
        else None,
        "duration_over_limit_last_20pct": binding,
        "useful_rel_heldout": {b: {k: _iv(x) for k, x in d.items()} for b, d in m.useful_h.items()},
        "talk_per_agent_second_heldout_by_team": {
            b: {k: _iv(x) for k, x in d.items()} for b, d in m.talk_by_team.items()
        },
        "latency": {
            k: {
                f: _iv(x) if isinstance(x, Interval) else x for f, x in d.items() if f != "per_seed"
            }
            for k, d in m.lat.items()
        },
    }


#: How the figures and verdicts are computed, as summary.json says it.
STATISTICS = {
    "figures": "mean over training seeds [95% Student-t interval over the per-seed means], "
    "the per-seed values beside it; a policy with one row (random) has its instances' "
    "bootstrap",
    "verdicts": "each finding's parts are paired contrasts by (seed, instance) or per-seed "
    "figures against a size; its p-value is the largest two-sided t-test p-value over "
    "training seeds (every part on the claimed side, else 1); Holm's correction over "
    "the primary findings; yes when the adjusted p-value is below 0.05",
    "primary": list(PRIMARY),
    "secondary": list(SECONDARY),
    "scripts": "a finding's script is marked reproduces when its figure shows the claim "
    "(its size) without learning; a yes that one of the CONTROLS also gets is no yes",
    "controls": list(CONTROLS),
}


def report(out: Path, m: Measured, found: list[dict[str, Any]], study: Study) -> None:
    """The figures, summary.json and README.md in ``out``, each verdict printed."""
    figures = plots(out, m)
    s = summary(m, found, figures, study)
    (out / "summary.json").write_text(json.dumps(s, indent=1))
    write_readme(out, s)
    for f in found:
        lo, hi = f["interval"]
        val = (
            "missing"
            if f["value"] is None or lo is None
            else f"{f['value']:.3g} [{lo:.3g}, {hi:.3g}]"
        )
        print(f"{f['verdict']:>4}  {f['finding']}: {val}, p (Holm) {f['p_holm']:.2g}", flush=True)
    print(f"wrote {out} in {s['wall_seconds'] / 60:.1f} min", flush=True)


# -- README.md ----------------------------------------------------------------------------------


def _fmt(x: Any) -> str:
    if isinstance(x, dict):
        if x.get("mean") is None:
            return "missing"
        lo, hi = x.get("lo"), x.get("hi")
        return f"{x['mean']:.3g}" + ("" if lo is None else f" [{lo:.3g}, {hi:.3g}]")
    return "missing" if x is None else f"{x:.3g}"


def write_readme(out: Path, s: dict[str, Any]) -> None:
    """README.md from summary.json's ``s``: how it was run and judged, the findings' table, the
    held-out scores, the no-pressure limit's share, the orchestrator's check, the figures and
    the settings."""
    lines = [
        *_readme_head(s),
        *_readme_findings(s),
        *_readme_scores(s),
        *_readme_no_pressure(s),
        *_readme_frozen(s),
        "",
        "Figures: " + ", ".join(f"[{f}]({f})" for f in s["figures"]),
        "",
        "Settings (every run's full config is in `runs/<name>-s<seed>/config.toml`):",
        "",
    ]
    for name, cfg in s["settings"].items():
        lines.append(f"- `{name}`: " + ", ".join(f"{k}={v}" for k, v in cfg.items()))
    (out / "README.md").write_text("\n".join(lines) + "\n")


def _readme_head(s: dict[str, Any]) -> list[str]:
    return [
        "# Signs of life: results",
        "",
        "Written by `python bench/signs_of_life.py` (its docstring says what each figure is). "
        f"quick={s['quick']}; training seeds by run {s['seeds_by_run']}, {s['instances']} held-out "
        f"instances per team size; {s['wall_seconds'] / 60:.1f} min in all "
        f"({s['train_seconds'] / 60:.1f} training, "
        f"{s['jobs']} at a time), {s['cpu_seconds'] / 60:.1f} CPU min. Every run starts from "
        "the prior (bench/results/prior/), main_scratch from each seed's own fresh weights: a "
        "run's 'untrained' is its starting weights."
        + (
            " Summarised with --complete-only from the runs that had finished: the times above "
            "are the summary's alone, not the training's."
            if s.get("complete_only")
            else ""
        ),
        "Every figure: mean [95% Student-t interval over training seeds], each seed held out on "
        "its own fresh instances, random and the scripts too. Verdict: each finding is judged "
        "by paired contrasts, by training seed and instance, against the same seed's "
        "untrained weights and random (and the claim's size, where it has one); yes only when "
        "every contrast is "
        "on the claimed side and the largest of their p-values, Holm-adjusted over the "
        f"{len(PRIMARY)} primary findings named in advance, is below 0.05 "
        "(collective/studies/intervals.py).",
        *(
            []
            if s["quick"]
            else ["", "What reproduced, what did not, and why: [DISCUSSION.md](DISCUSSION.md)."]
        ),
        "",
        "Scripted controls (policy/scripted.py) run through the same protocol: the oracle "
        "(hand-written skill: what the world allows) and "
        + ", ".join(CONTROLS)
        + " (each lacks a skill); a script marked (shows it) reproduces the finding without "
        "learning, and a yes a control also gets is built in, so no yes. Primary findings "
        f"(Holm family, named in advance): {', '.join(s['statistics']['primary'])}; secondary "
        f"(judged alone): {', '.join(s['statistics'].get('secondary', []))}.",
        "",
    ]


def _readme_findings(s: dict[str, Any]) -> list[str]:
    lines = [
        "| finding | trained | random | untrained | other baselines | scripts (shows it?) "
        "| paired contrasts (null) | p (Holm) | seed | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in s["findings"]:
        value = {"mean": f["value"], "lo": f["interval"][0], "hi": f["interval"][1]}
        per_seed = ", ".join(f"{v:.3g}" for v in f["per_seed"])
        b = dict(f["baselines"])
        rnd, unt = b.pop("random", None), b.pop("untrained", None)
        other = "; ".join(f"{k} {_fmt(v)}" for k, v in b.items()) or "-"
        parts = "; ".join(
            f"{k} {_fmt(c)} ({c['side']} {c['null']:g})" for k, c in f["contrasts"].items()
        )
        scripted = "; ".join(
            f"{k} {_fmt(d['figure'])}"
            + ("" if d["reproduces"] is None else " (shows it)" if d["reproduces"] else " (no)")
            for k, d in f.get("scripts", {}).items()
        )
        lines.append(
            f"| {f['finding']} | {_fmt(value)}"
            + (f" (seeds: {per_seed})" if per_seed else "")
            + f" | {_fmt(rnd)} | {_fmt(unt)} | {other} | {scripted or '-'} | {parts or '-'} | "
            f"{f['p']:.2g} ({f['p_holm']:.2g}) | {f['seed_figure']} | {f['verdict']} ({f['why']}) |"
        )
    return lines


def _readme_scores(s: dict[str, Any]) -> list[str]:
    lines = ["", "Held-out mean score by run (T = 180 s):", ""]
    for name, per in s["heldout"].items():
        lines.append(f"- `{name}`: " + ", ".join(f"{k} {_fmt(d['score'])}" for k, d in per.items()))
    return lines


def _readme_no_pressure(s: dict[str, Any]) -> list[str]:
    loose = s.get("no_pressure_limit")
    if not loose:
        return []
    tr = loose["training"]
    lines = [
        "",
        f"No-pressure limit ({loose['limit']:g} s): what ended its episodes. Training: the "
        f"limit ended {pct(tr['share_at_limit'])} of {tr['episodes']} "
        f"({pct(tr['share_at_limit_last_20pct'])} in the last 20% of steps); all ends: "
        + ", ".join(f"{k} {v}" for k, v in sorted(tr["ends"].items()))
        + ".",
        "",
        "| held-out | policy | ended by the limit | task done | ended by the limit, by team |",
        "|---|---|---|---|---|",
    ]
    for key in (k for k in loose if k.startswith("heldout_at_")):
        for kind, d in loose[key].items():
            teams = ", ".join(f"{t}: {pct(v)}" for t, v in d["at_limit_by_team"].items())
            lines.append(
                f"| at {key.removeprefix('heldout_at_')} | {kind} | "
                f"{pct(d['share_at_limit'])} | {pct(d['share_task_done'])} | {teams} |"
            )
    return [
        *lines,
        "",
        f"Held-out at {loose['limit']:g} s: "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in loose["score_at_own_limit"].items())
        + " (at 180 s the table above has the `no_pressure` row beside the main run's "
        "baselines).",
    ]


def _readme_frozen(s: dict[str, Any]) -> list[str]:
    frozen = s.get("orchestrator_frozen")
    if not frozen:
        return []
    return [
        "",
        "Orchestrator's sub-agents frozen (checked on its training episodes): "
        f"{frozen['sub_agents_frozen']}; turns "
        + ", ".join(f"{k} {v}" for k, v in frozen["turns"].items())
        + "; steps whose trained tokens are exactly the orchestrator's: "
        f"{frozen['steps_whose_trained_tokens_are_the_orchestrators']}.",
    ]

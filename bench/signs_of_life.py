"""Signs of life: do collectives trained with RLCR learn to use parallel inference?

Trains the tiny policy with RLCR (collective/train.py) and measures, in kind, the three findings
the reference work reported (see ../shared/DESIGN.md, "Signs of life"):

1. useful work relative to the environment's average rollout, by team size, over training;
2. communication intensity, and score, over training;
3. after training: score against simulated time for the trained 8-agent collective and for a
   solo agent given the same total token budget; where the collective overtakes, and how much
   longer the solo agent needs to reach the collective's final score;
4. ablations: latency pressure by time limit vs explicit latency penalty vs none; the flat
   collective advantage vs a per-agent (own contribution) advantage.

Every figure comes from real training runs of the project's own code; every run is seeded and
its config is saved beside it (runs/<name>/config.toml), so ``python bench/signs_of_life.py``
again gives the same curves. ``--quick`` is the few-minute version the test suite runs.

    python bench/signs_of_life.py                 # ~20 minutes on 2 cores
    python bench/signs_of_life.py --quick --out /tmp/sol
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collective import EpisodeConfig, run_episodes  # noqa: E402
from collective.plots import useful_work_lines  # noqa: E402
from collective.train import TrainConfig, bucket, load_config, read_metrics, train  # noqa: E402
from policy.latency import latency_preset  # noqa: E402
from policy.tiny import TinyConfig, TinyModel, TinyPolicy  # noqa: E402

OUT = ROOT / "bench" / "results" / "signs_of_life"
EVAL_T = 180.0  # the time limit every run's final policy is evaluated at (the main run's last)
MODEL = TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, context=128)


def base_config(quick: bool) -> dict[str, Any]:
    """The main run: workshop, CEO organisation with mixed hiring budgets (a team of k is the
    CEO plus up to k - 1 hires), and a rising time limit."""
    return dict(
        world="workshop",
        org="ceo",
        team_sizes=(1, 2, 3, 4, 8),
        steps=4 if quick else 60,
        groups_per_step=5,
        group_size=4 if not quick else 2,
        seed=0,
        time_limit="linear",
        time_limit_start=90.0,
        time_limit_end=180.0,
        learning_rate=1e-2,
        max_output_tokens=24,
        concurrency=20,
        plots=False,
        snapshot_every=1000,
        model=MODEL,
    )


def variants(quick: bool) -> dict[str, dict[str, Any]]:
    base = base_config(quick)
    t_end = base["time_limit_end"]
    # Twice the main run's last limit: loose enough that finishing sooner earns nothing, tight
    # enough to keep the whole script inside 30 minutes on 2 cores (episodes cost wall time in
    # proportion to their simulated length; 4x took 12 s a step).
    loose = 2 * t_end
    return {
        "workshop": base,
        "relay": {**base, "world": "relay"},
        "penalty": {
            **base,
            "time_limit": "constant",
            "time_limit_start": loose,
            "time_limit_end": loose,
            "latency_penalty": 0.5,
        },
        "no_pressure": {
            **base,
            "time_limit": "constant",
            "time_limit_start": loose,
            "time_limit_end": loose,
        },
        "per_agent": {**base, "advantage": "individual"},
    }


def run_all(out: Path, quick: bool, only: set[str] | None) -> dict[str, Path]:
    dirs = {}
    for name, fields in variants(quick).items():
        if only and name not in only:
            continue
        cfg = TrainConfig(**fields)
        run = out / "runs" / name
        dirs[name] = run
        done = (run / "metrics.jsonl").exists() and len(read_metrics(run)) >= cfg.steps
        if done:
            print(f"[{name}] already complete")
            continue
        print(f"[{name}] training {cfg.steps} steps")
        t0 = time.perf_counter()
        train(cfg, run, resume=(run / "config.toml").exists(), progress=True)
        print(f"[{name}] {time.perf_counter() - t0:.0f} s")
    return dirs


# -- 3. performance against latency -----------------------------------------------------------


def curve_at(curve: list[tuple[float, float]], times: np.ndarray) -> np.ndarray:
    """The anytime score at each time (a step function: the last value at or before t)."""
    ts = np.array([t for t, _ in curve])
    vs = np.array([v for _, v in curve])
    idx = np.searchsorted(ts, times, side="right") - 1
    return vs[np.clip(idx, 0, None)]


def first_time(grid: np.ndarray, values: np.ndarray, level: float) -> float | None:
    hit = np.nonzero(values >= level - 1e-9)[0]
    return float(grid[hit[0]]) if len(hit) else None


def latency_study(run: Path, seeds: int, team: int) -> dict[str, Any]:
    """The trained collective (CEO hiring up to team - 1, or a flat team) against a solo agent
    given the same total output-token budget, on the same task instances."""
    cfg = load_config(run / "config.toml")
    model = TinyModel.load(run / "checkpoints" / "latest.pt")
    t_max = cfg.time_limit_end
    team_cfgs = [team_episode(cfg, team, 50_000 + s, s, t_max) for s in range(seeds)]
    collective = run_episodes(team_cfgs, TinyPolicy(model), concurrency=seeds)
    # The solo agent may run until it has spent what the whole collective spent.
    horizon = t_max * team * 2
    solo_cfgs = [team_episode(cfg, 1, 50_000 + s, s, horizon, task=team) for s in range(seeds)]
    solos = run_episodes(solo_cfgs, TinyPolicy(model), concurrency=seeds)
    grid = np.linspace(0, horizon, 400)
    team_curves, solo_curves, budgets, cut = [], [], [], []
    for c, s in zip(collective, solos, strict=True):
        budget = c.stats.output_tokens
        spent, stop = 0, horizon
        for t in sorted(s.turns, key=lambda t: t.answered):
            spent += len(t.token_ids)
            if spent >= budget:
                stop = min(t.answered, horizon)
                break
        solo = curve_at(s.curve, grid)
        solo[grid > stop] = curve_at(s.curve, np.array([stop]))[0]  # budget spent: it stops
        team_curve = curve_at(c.curve, grid)
        team_curve[grid > t_max] = c.score
        team_curves.append(team_curve)
        solo_curves.append(solo)
        budgets.append(budget)
        cut.append(stop)
    team_mean, solo_mean = np.mean(team_curves, 0), np.mean(solo_curves, 0)
    final = float(team_mean[np.searchsorted(grid, t_max)])
    ahead = team_mean > solo_mean + 1e-9
    crossover = float(grid[np.argmax(ahead)]) if ahead.any() else None
    t_team = first_time(grid, team_mean, final) if final > 0 else None
    t_solo = first_time(grid, solo_mean, final) if final > 0 else None
    return {
        "team": team,
        "seeds": seeds,
        "t_max": t_max,
        "horizon": horizon,
        "token_budget_mean": float(np.mean(budgets)),
        "solo_stopped_at_mean": float(np.mean(cut)),
        "collective_final_score": final,
        "solo_score_at_t_max": float(solo_mean[np.searchsorted(grid, t_max)]),
        "solo_final_score": float(solo_mean[-1]),
        "crossover_time": crossover,
        "time_to_collective_final": {"collective": t_team, "solo": t_solo},
        "time_ratio": (t_solo / t_team) if (t_solo and t_team) else None,
        "grid": grid.tolist(),
        "collective_curve": team_mean.tolist(),
        "solo_curve": solo_mean.tolist(),
    }


def team_episode(
    cfg: TrainConfig,
    team: int,
    world_seed: int,
    sample_seed: int,
    time_limit: float,
    task: int = 0,
) -> EpisodeConfig:
    """An evaluation episode shaped like training's: a CEO hiring up to team - 1 under the
    ``ceo`` organisation, a team of ``team`` otherwise; the task is sized for ``task`` agents
    (default: the team), so a solo agent can be given the collective's task."""
    agents, budget = (1, team - 1) if cfg.org == "ceo" else (team, 0)
    return EpisodeConfig(
        world=cfg.world,
        params=dict(cfg.params),
        org=cfg.org,
        agents=agents,
        world_agents=task or team if (cfg.org == "ceo" or task) else 0,
        budget=budget,
        world_seed=world_seed,
        sample_seed=sample_seed,
        time_limit=time_limit,
        max_output_tokens=cfg.max_output_tokens,
        latency=latency_preset(cfg.latency),
        policy="trained",
    )


# -- 1, measured cleanly: useful work by team size before and after training --------------------


def useful_work(run: Path, seeds: int) -> dict[str, dict[str, float]]:
    """Useful tokens per rollout by team size, relative to the average rollout of the same
    evaluation, for the untrained and the trained policy on the same held-out instances. (The
    training curve shows the same measure step by step, but one group per team size and step
    makes it noisy; this is the steady version of its two ends.)"""
    from policy.tiny import TinyModel

    cfg = load_config(run / "config.toml")
    out = {}
    for name, model in (
        ("untrained", TinyModel.fresh(cfg.model)),
        ("trained", TinyModel.load(run / "checkpoints" / "latest.pt")),
    ):
        per_team: dict[str, list[int]] = {}
        for team in cfg.team_sizes:
            cfgs = [
                team_episode(cfg, team, 70_000 + s, s, cfg.time_limit_end) for s in range(seeds)
            ]
            episodes = run_episodes(cfgs, TinyPolicy(model), concurrency=seeds)
            per_team[bucket(team)] = per_team.get(bucket(team), []) + [
                e.stats.world_tokens for e in episodes
            ]
        average = float(np.mean([x for v in per_team.values() for x in v]))
        out[name] = {b: float(np.mean(v)) / average for b, v in per_team.items()}
    return out


# -- 4. held-out evaluation of each run --------------------------------------------------------


def evaluate(run: Path, seeds: int) -> dict[str, float]:
    """Mean score of a run's final policy on held-out instances, every team size, at the
    main run's final time limit (the same yardstick for every ablation)."""
    cfg = load_config(run / "config.toml")
    model = TinyModel.load(run / "checkpoints" / "latest.pt")
    out = {}
    for team in cfg.team_sizes:
        cfgs = [team_episode(cfg, team, 90_000 + s, s, EVAL_T) for s in range(seeds)]
        episodes = run_episodes(cfgs, TinyPolicy(model), concurrency=seeds)
        out[str(team)] = float(np.mean([e.score for e in episodes]))
    return out


# -- figures ---------------------------------------------------------------------------------------


def plots(
    out: Path,
    runs: dict[str, Path],
    latency: dict[str, Any] | None,
    evals: dict[str, dict[str, float]],
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(name)

    main = read_metrics(runs["workshop"])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    useful_work_lines(ax, main)
    ax.set(
        xlabel="training step",
        ylabel="useful tokens per rollout / environment average",
        title="1. Useful work by team size (workshop, CEO budgets)",
    )
    save(fig, "useful_work.png")

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name in ("workshop", "relay"):
        if name in runs:
            rows = read_metrics(runs[name])
            axes[0].plot([m.step for m in rows], [m.comm_tokens_per_hour for m in rows], label=name)
            axes[1].plot([m.step for m in rows], [m.score_mean for m in rows], label=name)
    axes[0].set(
        xlabel="training step",
        ylabel="tokens / simulated hour",
        title="2a. Communication intensity",
    )
    axes[1].set(xlabel="training step", ylabel="mean score", title="2b. Score over training")
    for a in axes:
        a.legend()
    save(fig, "communication_and_score.png")

    if latency:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        grid = np.array(latency["grid"]) / 60
        ax.plot(grid, latency["collective_curve"], label=f"collective of {latency['team']}")
        ax.plot(grid, latency["solo_curve"], label="solo, same token budget")
        if latency["crossover_time"] is not None:
            ax.axvline(
                latency["crossover_time"] / 60, color="grey", ls=":", label="collective ahead"
            )
        ax.set(
            xlabel="simulated minutes", ylabel="mean score", title="3. Performance against latency"
        )
        ax.legend()
        save(fig, "latency.png")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("workshop", "penalty", "no_pressure", "per_agent"):
        if name in runs:
            rows = read_metrics(runs[name])
            label = "time limit (main)" if name == "workshop" else name
            axes[0].plot([m.step for m in rows], [m.score_mean for m in rows], label=label)
    axes[0].set(
        xlabel="training step",
        ylabel="mean score (own time limit)",
        title="4a. Ablations during training",
    )
    axes[0].legend()
    names = [
        n for n in ("workshop", "penalty", "no_pressure", "per_agent", "untrained") if n in evals
    ]
    means = [float(np.mean(list(evals[n].values()))) for n in names]
    axes[1].bar(names, means)
    axes[1].set(
        ylabel=f"held-out mean score, all teams, T={EVAL_T:g} s", title="4b. Ablations, evaluated"
    )
    axes[1].tick_params(axis="x", rotation=20)
    save(fig, "ablations.png")
    return files


def _yes(reproduced: bool) -> str:
    return "yes" if reproduced else "no"


def verdicts(
    runs: dict[str, Path],
    latency: dict[str, Any] | None,
    evals: dict[str, dict[str, float]],
    useful: dict[str, dict[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """Each reference finding, with the measured figure and whether it reproduced in kind."""
    main = read_metrics(runs["workshop"])
    first = max(1, len(main) // 20)  # "starts": the first 5% of training
    k = max(1, len(main) // 5)  # "reaches": the last 20%
    big = [m.useful_rel.get("5-8") for m in main]
    big = [b for b in big if b is not None]
    start, end = float(np.mean(big[:first])), float(np.mean(big[-k:]))
    where_start = f"over the first {first} training steps"
    where_end = f"over the last {k} training steps"
    if useful and "5-8" in useful["untrained"]:
        start, end = useful["untrained"]["5-8"], useful["trained"]["5-8"]
        where_start = where_end = "on held-out instances"
    comm: dict[str, tuple[float, float]] = {}  # per run: first vs last 20% of its steps
    for name, run in runs.items():
        c = [m.comm_tokens_per_hour for m in read_metrics(run)]
        kk = max(1, len(c) // 5)
        comm[name] = float(np.mean(c[:kk])), float(np.mean(c[-kk:]))
    rises = [name for name, (c0, c1) in comm.items() if c1 > c0 * 1.1]
    out = [
        {
            "finding": "a team of 5-8 starts below the average rollout in useful work",
            "measured": f"{start:.2f} x average, untrained, {where_start}",
            "reproduced": _yes(start < 1.0),
        },
        {
            "finding": "... and reaches about twice the average",
            "measured": f"{end:.2f} x average, trained, {where_end}",
            "reproduced": _yes(end >= 1.6),
        },
        {
            "finding": "communication rises with training",
            "measured": "tokens per simulated hour, first -> last 20% of steps: "
            + "; ".join(f"{n} {c0:.0f} -> {c1:.0f}" for n, (c0, c1) in comm.items()),
            "reproduced": "yes" if "workshop" in rises else "partly" if rises else "no",
        },
    ]
    if latency:
        ratio = latency["time_ratio"]
        out.append(
            {
                "finding": "a solo agent with the same token budget needs ~4x as long",
                "measured": (
                    f"never reached the collective's {latency['collective_final_score']:.2f} "
                    f"within the budget: it was spent by {latency['solo_stopped_at_mean']:.0f} s, "
                    f"{latency['solo_stopped_at_mean'] / latency['t_max']:.1f}x the collective's "
                    f"{latency['t_max']:.0f} s, at score {latency['solo_final_score']:.2f}"
                )
                if ratio is None
                else f"{ratio:.1f}x as long",
                "reproduced": _yes(ratio is None or ratio >= 2.5),
            }
        )
        out.append(
            {
                "finding": "the collective overtakes the solo agent after some time",
                "measured": "never"
                if latency["crossover_time"] is None
                else f"at {latency['crossover_time'] / 60:.1f} simulated minutes",
                "reproduced": _yes(latency["crossover_time"] is not None),
            }
        )
    if {"workshop", "no_pressure"} <= evals.keys():
        a, b = (
            np.mean(list(evals["workshop"].values())),
            np.mean(list(evals["no_pressure"].values())),
        )
        out.append(
            {
                "finding": "latency pressure matters (time limit beats no pressure)",
                "measured": f"{a:.3f} vs {b:.3f} held-out mean score",
                "reproduced": _yes(a > b),
            }
        )
    if {"workshop", "per_agent"} <= evals.keys():
        a, b = np.mean(list(evals["workshop"].values())), np.mean(list(evals["per_agent"].values()))
        out.append(
            {
                "finding": "the flat collective advantage beats a per-agent advantage",
                "measured": f"{a:.3f} vs {b:.3f} held-out mean score",
                "reproduced": _yes(a > b),
            }
        )
    return out


def write_readme(out: Path, summary: dict[str, Any]) -> None:
    lines = [
        "# Signs of life: results",
        "",
        "Written by `python bench/signs_of_life.py` (its docstring says what each figure is).",
        f"quick={summary['quick']}. This invocation took {summary['wall_seconds'] / 60:.1f} min "
        "(a run already complete is reused, not trained again). Training wall time of each run "
        "(since its last start, from its metrics): "
        + ", ".join(f"{n} {s:.0f} s" for n, s in summary["train_seconds"].items())
        + f" ({sum(summary['train_seconds'].values()) / 60:.1f} min in all).",
        "",
        *(
            []
            if summary["quick"]
            else ["What the findings mean and what was tried: [DISCUSSION.md](DISCUSSION.md).", ""]
        ),
        "| reference finding | measured here | reproduced in kind? |",
        "|---|---|---|",
    ]
    for v in summary["verdicts"]:
        lines.append(f"| {v['finding']} | {v['measured']} | {v['reproduced']} |")
    lines += ["", "Figures: " + ", ".join(f"[{f}]({f})" for f in summary["figures"]), ""]
    lines += ["Settings (every run's full config is in `runs/<name>/config.toml`):", ""]
    for name, cfg in summary["settings"].items():
        lines.append(f"- `{name}`: " + ", ".join(f"{k}={v}" for k, v in cfg.items()))
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a few-minute smoke version")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--only", default="", help="comma-separated runs (default: all)")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    a.out.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, a.only.split(","))) or None
    if only is not None and not only <= set(variants(a.quick)):
        p.error(f"--only: unknown runs {sorted(only - set(variants(a.quick)))}")
    if only is not None and "workshop" not in only:
        p.error("--only must include workshop: every figure compares against the main run")
    runs = run_all(a.out, a.quick, only)
    seeds = 3 if a.quick else 12
    latency = latency_study(runs["workshop"], seeds, team=8) if "workshop" in runs else None
    evals = {name: evaluate(run, seeds) for name, run in runs.items()}
    useful = useful_work(runs["workshop"], seeds) if "workshop" in runs else None
    figures = plots(a.out, runs, latency, evals)
    differences = {
        name: {
            k: v
            for k, v in fields.items()
            if base_config(a.quick).get(k) != v or name == "workshop"
        }
        for name, fields in variants(a.quick).items()
        if name in runs
    }
    summary = {
        "quick": a.quick,
        "wall_seconds": time.perf_counter() - t0,
        "train_seconds": {name: read_metrics(run)[-1].wall_time for name, run in runs.items()},
        "latency": latency,
        "evaluation": evals,
        "useful_work": useful,
        "verdicts": verdicts(runs, latency, evals, useful),
        "figures": figures,
        "settings": {
            n: {k: (str(v) if not isinstance(v, int | float | str) else v) for k, v in d.items()}
            for n, d in differences.items()
        },
        "metrics": {
            name: [msgspec.to_builtins(m) for m in read_metrics(run)] for name, run in runs.items()
        },
    }
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_readme(a.out, summary)
    for v in summary["verdicts"]:
        print(f"{v['reproduced']:>6}  {v['finding']}: {v['measured']}")
    print(f"wrote {a.out} in {summary['wall_seconds'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())

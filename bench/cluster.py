"""Rollouts on Ray against rollouts in this process: what the cluster layer costs.

One run, side by side, interleaved (local, Ray x 1 worker, Ray x 2 workers, then again), the
same training config each time (``configs/quick.toml`` shortened; ``--set`` for more):

- **rollouts/s**: episodes finished per wall second over the steps after the first (the first
  holds the start-up: model building, and on Ray the workers' processes);
- **learner steps/s**: one over the mean ``learner_seconds`` of a step;
- **start-up**: seconds to the first finished step; **total**: the whole ``train`` call;
- **same science**: every placement's per-step metrics (all but the wall-clock ones) must be
  the local run's; the script says so, or fails.

Ray runs on a local Ray started once with ``--cpus`` CPUs (default 2, this machine's cores) and
no dashboard; its start-up is not counted. Figures go to ``bench/results/ray/cluster.json`` and
``cluster.png``. Run: ``python bench/cluster.py [--quick] [--set KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import msgspec

from collective.rl.rundir import StepMetrics
from collective.rl.train import load_config, read_metrics, train

_HERE = Path(__file__).resolve().parent

OUT = _HERE / "results" / "ray"
ROOT = _HERE.parent
PLACEMENTS = {
    "local": [],
    "ray x1": ["cluster.backend=ray", "cluster.rollout_workers=1"],
    "ray x2": ["cluster.backend=ray", "cluster.rollout_workers=2"],
}


def measure(sets: list[str], placement: list[str], where: Path) -> dict:
    cfg = load_config(ROOT / "configs" / "quick.toml", [*sets, *placement])
    shutil.rmtree(where, ignore_errors=True)
    t0 = time.perf_counter()
    train(cfg, where, progress=False)
    total = time.perf_counter() - t0
    rows = read_metrics(where)
    steady = rows[-1].wall_time - rows[0].wall_time
    episodes = sum(r.episodes for r in rows[1:])
    return {
        "rollouts_per_s": episodes / steady if steady > 0 else 0.0,
        "learner_steps_per_s": 1.0 / statistics.mean(r.learner_seconds for r in rows),
        "startup_s": rows[0].wall_time,
        "total_s": total,
        "batch_mean": statistics.mean(r.rollout_batch_mean for r in rows),
        "science": [
            {k: v for k, v in msgspec.to_builtins(r).items() if k not in StepMetrics.WALL_CLOCK}
            for r in rows
        ],
    }


# Assumptions of the 64-node estimate (not measured here: no GPU): one H200 serving an 8B model
# with SGLang at large batch, aggregate tokens per second, round figures of the published order.
ASSUMED = {"decode_tok_s_per_server": 10_000.0, "prefill_tok_s_per_server": 50_000.0}
NODES, SERVERS, CORES_PER_NODE = 64, 8, 16


def team_of_8() -> dict:
    """One workshop episode of a team of 8 at the training default T_max (600 s), latency of an
    8B model on an H200 (``h200-8b``), the tiny policy: its tokens and its engine cost."""
    import trio

    from collective import Conductor, EpisodeConfig, latency_preset
    from policy.tiny import TinyConfig, TinyModel, TinyPolicy

    cfg = EpisodeConfig(
        world="workshop",
        agents=8,
        world_seed=1,
        sample_seed=1,
        time_limit=600.0,
        latency=latency_preset("h200-8b"),
        max_output_tokens=24,
        keep_prompts=False,
    )
    conductor = Conductor(TinyPolicy(TinyModel.fresh(TinyConfig())))
    t0 = time.perf_counter()
    ep = trio.run(lambda: conductor.play([cfg]))[0]
    wall = time.perf_counter() - t0
    engine = wall - conductor.batch_stats.policy_seconds
    return {
        "turns": ep.stats.turns,
        "prompt_tokens": ep.stats.prompt_tokens,
        "output_tokens": ep.stats.output_tokens,
        "wall_s": wall,
        "engine_s": engine,  # everything but the policy: what a rollout node does with SGLang
    }


def estimate(team: dict) -> dict:
    per_server = 1.0 / (
        team["prompt_tokens"] / ASSUMED["prefill_tok_s_per_server"]
        + team["output_tokens"] / ASSUMED["decode_tok_s_per_server"]
    )
    fleet = SERVERS * per_server
    nodes = NODES * CORES_PER_NODE / team["engine_s"]
    return {
        "assumed": {
            **ASSUMED,
            "nodes": NODES,
            "servers": SERVERS,
            "cores_per_node": CORES_PER_NODE,
        },
        "fleet_episodes_per_s": fleet,
        "rollout_nodes_episodes_per_s": nodes,
        "sustained_episodes_per_s": min(fleet, nodes),
        "bound_by": "SGLang fleet" if fleet < nodes else "rollout nodes",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps, one repeat")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    import ray

    steps = 4 if a.quick else 8
    sets = [f"steps={steps}", "plots=false", *a.set]
    repeats = 1 if a.quick else a.repeats
    t0 = time.perf_counter()
    ray.init(num_cpus=a.cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray_start = time.perf_counter() - t0
    results: dict[str, list[dict]] = {name: [] for name in PLACEMENTS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for name, placement in PLACEMENTS.items():
                r = measure(sets, placement, Path(tmp) / f"{name}-{rep}".replace(" ", ""))
                results[name].append(r)
                print(
                    f"{name:7s} rep {rep}: {r['rollouts_per_s']:6.2f} rollouts/s, "
                    f"{r['learner_steps_per_s']:5.2f} learner steps/s, start-up "
                    f"{r['startup_s']:5.1f} s, total {r['total_s']:5.1f} s",
                    flush=True,
                )
    ray.shutdown()
    team = team_of_8()
    science = results["local"][0]["science"]
    same = all(r["science"] == science for rs in results.values() for r in rs)
    summary = {
        name: {
            k: statistics.median(r[k] for r in rs)
            for k in ("rollouts_per_s", "learner_steps_per_s", "startup_s", "total_s", "batch_mean")
        }
        for name, rs in results.items()
    }
    base = summary["local"]["rollouts_per_s"]
    for s in summary.values():
        s["rollouts_vs_local"] = s["rollouts_per_s"] / base if base else 0.0
    report = {
        "config": sets,
        "cpus": a.cpus,
        "os_cpus": os.cpu_count(),
        "load_at_end": os.getloadavg(),
        "ray_version": ray.__version__,
        "ray_start_s": ray_start,
        "same_science": same,
        "summary": summary,
        "team_of_8": team,
        "estimate_64_nodes_8_servers": estimate(team),
        "runs": {
            k: [{x: y for x, y in r.items() if x != "science"} for r in v]
            for k, v in results.items()
        },
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "cluster.json").write_text(json.dumps(report, indent=1))
    print(
        json.dumps(
            {
                k: report[k]
                for k in ("same_science", "summary", "team_of_8", "estimate_64_nodes_8_servers")
            },
            indent=1,
        )
    )
    plot(summary, a.out / "cluster.png", sets)
    if not same:
        raise SystemExit("placements disagree: the same config gave different runs")


def plot(summary: dict[str, dict], path: Path, sets: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, (key, title) in zip(
        axes,
        [
            ("rollouts_per_s", "rollouts / s (after step 0)"),
            ("learner_steps_per_s", "learner steps / s"),
            ("startup_s", "seconds to the first step"),
        ],
        strict=True,
    ):
        ax.bar(names, [summary[n][key] for n in names], color=["#555", "#4a7", "#27a"])
        ax.set_title(title)
    fig.suptitle(f"local vs Ray rollout workers, same config ({' '.join(sets)}), 2 cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()

"""Flat vs individual vs turn credit at equal compute (issue 30, item 2's study).

One long-horizon, many-agent task (the signs of life's workshop, teams of 4 and 8, 180
simulated seconds) trained three ways, each at ``--seeds`` training seeds:

- ``flat``: the recipe's one collective advantage on every token of every agent;
- ``individual``: each agent's leave-one-out credit, zero-mean over the group's agents
  (``collective/rl/credit.py``);
- ``turn``: ``fork_turns`` sampled turns a rollout, each forked ``fork_samples`` times and
  played to the end; the turn's advantage is its return minus its forks' mean
  (``collective/rl/forks.py``).

Equal compute means equal rollouts sampled by the policy: a run gets ``--budget`` of them, so a
scheme that samples more a step (turn's forks) gets fewer steps. Leave-one-out re-runs call no
model (they replay the record with one agent idle) and are not counted, but reported. Then
every run is measured held out (``--instances`` task instances a team size, never trained on)
beside random, its seed's untrained weights and the signs of life's scripted controls (the
oracle script's score is the level a hand-written policy reaches), and the schemes are compared
paired by seed and instance (same seed: the same initial weights and the same held-out
episodes), with t-intervals over the seeds (``collective.studies.intervals``).

    python bench/credit_study.py               # 3 seeds, budget 640 rollouts (flat: 40 steps)
    python bench/credit_study.py --quick       # 2 seeds, budget 64: the machinery only (~5 min)

Writes ``bench/results/credit/`` (``summary.json``, ``credit.png``, ``runs/``); runs and
measurements are re-used by digest, so a stopped study resumes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from tqdm import tqdm

from bench.world_mix import _train, held_out, scores
from collective.rl.config import TrainConfig, Turn, mix, read_config
from collective.rl.rundir import read_metrics
from collective.studies.intervals import interval_text, paired_contrast, seed_interval
from experiments.resumable import digest, file_digest, train_digest
from policy.scripted import ScriptedPolicy, workshop_scripts
from policy.tiny import TinyConfig, TinyModel, TinyPolicy
from policy.uniform import RandomPolicy
from worlds.workshop import FINDINGS

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "credit"
SCHEMES = ("flat", "individual", "turn")


def base_config(seed: int) -> TrainConfig:
    return read_config(
        dict(
            world="workshop",
            params=dict(FINDINGS),  # the signs of life's world (worlds/workshop.py)
            team_sizes=(4, 8),
            latency="tiny-paced",
            time_limit_start=180.0,
            time_limit_end=180.0,
            groups_per_step=4,
            group_size=4,
            seed=seed,
            learning_rate=1e-2,
            max_output_tokens=24,
            concurrency=16,
            plots=False,
            model=TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, context=256),
        )
    )


def scheme_config(scheme: str, seed: int, budget: int) -> TrainConfig:
    """The run of ``scheme`` at ``seed`` whose policy-sampled rollouts fit ``budget``."""
    over: dict[str, Any] = {}
    if scheme == "individual":
        over = {"advantage": "individual"}
    elif scheme == "turn":
        over = {"advantage": "turn", "fork_turns": 2, "fork_samples": 2}
    cfg = msgspec.convert({**msgspec.to_builtins(base_config(seed)), **over}, TrainConfig)
    rollouts = cfg.groups_per_step * cfg.group_size
    if isinstance(cfg.advantage, Turn):  # every rollout's forks
        rollouts += rollouts * cfg.advantage.turns * cfg.advantage.samples
    return msgspec.structs.replace(cfg, steps=max(1, budget // rollouts))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--budget", type=int, default=640, help="policy-sampled rollouts a run")
    p.add_argument("--instances", type=int, default=8, help="held-out instances a team size")
    p.add_argument("--jobs", type=int, default=2, help="training runs at once")
    p.add_argument("--quick", action="store_true", help="2 seeds, budget 64: the machinery")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    seeds, budget, instances = (2, 64, 2) if a.quick else (a.seeds, a.budget, a.instances)
    out = a.out or (OUT / "quick" if a.quick else OUT)
    configs = {(k, s): scheme_config(k, s, budget) for k in SCHEMES for s in range(seeds)}
    runs = {(k, s): out / "runs" / f"{k}-s{s}" for k, s in configs}
    jobs = [(msgspec.json.encode(configs[r]).decode(), str(runs[r])) for r in configs]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(max(1, min(a.jobs, len(jobs)))) as workers:
        list(tqdm(workers.imap(_train, jobs), total=len(jobs), desc="train", unit="run"))

    world = mix(base_config(0))[0]
    cfgs = held_out(base_config(0), world, instances)
    measure = out / "measured.json"
    kept = json.loads(measure.read_text()) if measure.exists() else {}
    key = digest("random", msgspec.to_builtins(cfgs))
    if kept.get("random", {}).get("digest") != key:
        kept["random"] = {"digest": key, "scores": scores(cfgs, RandomPolicy())}
    # The scripted controls (the signs of life's): what a hand-written policy earns here. A
    # script keeps state per agent id, so each episode gets a fresh one.
    for name, script in workshop_scripts().items():
        key = digest("script", name, msgspec.to_builtins(cfgs))
        if kept.get(f"script|{name}", {}).get("digest") != key:
            played = [scores([c], ScriptedPolicy(script(), name=name))[0] for c in cfgs]
            kept[f"script|{name}"] = {"digest": key, "scores": played}
            measure.write_text(json.dumps(kept) + "\n")
    for s in tqdm(range(seeds), desc="untrained", unit="seed"):
        key = digest("untrained", s, msgspec.to_builtins(cfgs))
        if kept.get(f"untrained|{s}", {}).get("digest") != key:
            model = TinyModel.fresh(configs[("flat", s)].tiny)
            kept[f"untrained|{s}"] = {"digest": key, "scores": scores(cfgs, TinyPolicy(model))}
            measure.write_text(json.dumps(kept) + "\n")
    for r in tqdm(list(configs), desc="measure", unit="run"):
        ckpt = runs[r] / "checkpoints" / "latest.pt"
        key = digest(train_digest(configs[r]), file_digest(ckpt), msgspec.to_builtins(cfgs))
        name = f"{r[0]}|{r[1]}"
        if kept.get(name, {}).get("digest") != key:
            kept[name] = {"digest": key, "scores": scores(cfgs, TinyPolicy(TinyModel.load(ckpt)))}
            measure.write_text(json.dumps(kept) + "\n")
    measure.write_text(json.dumps(kept) + "\n")

    table = {k: [kept[f"{k}|{s}"]["scores"] for s in range(seeds)] for k in SCHEMES}
    untrained = [kept[f"untrained|{s}"]["scores"] for s in range(seeds)]
    random = [kept["random"]["scores"]]
    summary: dict[str, Any] = {
        "world": world.world,
        "team_sizes": list(world.team_sizes),
        "time_limit": world.time_limit_end,
        "seeds": seeds,
        "budget_rollouts": budget,
        "instances_per_team": instances,
        "random": float(np.mean(random)),
        "scripts": {n: float(np.mean(kept[f"script|{n}"]["scores"])) for n in workshop_scripts()},
        "untrained": msgspec.to_builtins(seed_interval(np.mean(untrained, axis=1))),
        "schemes": {},
    }
    for k in SCHEMES:
        rows = [read_metrics(runs[(k, s)]) for s in range(seeds)]
        sampled = [sum(m.episodes + m.fork_rollouts for m in r) for r in rows]
        summary["schemes"][k] = {
            "steps": configs[(k, 0)].steps,
            "rollouts_sampled": sampled,
            "trained": msgspec.to_builtins(seed_interval(np.mean(table[k], axis=1))),
            "minus_untrained": msgspec.to_builtins(paired_contrast(table[k], untrained)),
            "minus_random": msgspec.to_builtins(paired_contrast(table[k], random)),
            "minus_flat": None
            if k == "flat"
            else msgspec.to_builtins(paired_contrast(table[k], table["flat"])),
        }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    u = summary["untrained"]["mean"]
    print(f"random {summary['random']:.3f}, untrained {u:.3f} ({seeds} seeds, budget {budget})")
    print("scripts: " + ", ".join(f"{n} {v:.3f}" for n, v in summary["scripts"].items()))

    def iv(r: dict[str, Any]) -> str:
        return interval_text(r, ".3f", " (one seed: no interval)")

    for k, r in summary["schemes"].items():
        line = (
            f"{k:>10}: {r['steps']} steps, rollouts sampled {r['rollouts_sampled']}; trained "
            f"{r['trained']['mean']:.3f}, - untrained {iv(r['minus_untrained'])}"
        )
        if r["minus_flat"] is not None:
            line += f", - flat {iv(r['minus_flat'])}"
        print(line)
    plot(summary, out / "credit.png")
    print(f"wrote {out}")
    return 0


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["schemes"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, k in enumerate(names):
        iv = summary["schemes"][k]["minus_untrained"]
        err = 0.0 if iv["lo"] is None else iv["mean"] - iv["lo"]
        ax.bar(i, iv["mean"], yerr=err, capsize=4)
    ax.axhline(0.0, color="grey", lw=0.8)
    for name, style in (("oracle", "--"), ("no_communication", ":")):
        level = summary["scripts"][name] - summary["untrained"]["mean"]
        ax.axhline(level, color="black", ls=style, lw=0.8, label=f"{name} script")
    ax.legend(loc="best", fontsize=8)
    ax.set_xticks(
        range(len(names)), [f"{k}\n{summary['schemes'][k]['steps']} steps" for k in names]
    )
    ax.set(
        ylabel="held-out score - untrained (paired, t over seeds)",
        title=f"Credit at equal compute: {summary['budget_rollouts']} policy rollouts a run, "
        f"{summary['seeds']} seeds",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

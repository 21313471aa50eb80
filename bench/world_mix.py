"""Does a run over many worlds improve on each of them? (issue 30, item 1)

Trains ``configs/mix.toml`` (or ``--config``) at ``--seeds`` training seeds, then measures every
world of the mix held out: ``--instances`` task instances per team size, never trained on, each
played by the random policy, by every seed's untrained weights and by its trained weights,
through one protocol. Per world it gives trained - untrained and trained - random, paired by
seed and instance, with a t-interval over the seeds (``collective.studies.intervals``), and says
"improves" only where the interval against the untrained weights lies above zero.

    python bench/world_mix.py                # 3 seeds x 40 steps, ~15-25 min on 2 cores
    python bench/world_mix.py --quick        # 2 seeds x 4 steps, ~2 min: the machinery only

Writes ``bench/results/world_mix/`` (``summary.json``, ``world_mix.png``, ``runs/``); runs and
measurements are re-used by digest (``experiments.resumable``), so a stopped study
resumes.
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

from collective.engine.conductor import run_episodes
from collective.records import EpisodeConfig
from collective.rl.config import TrainConfig, WorldEntry, load_config, mix
from collective.studies.intervals import paired_contrast, seed_interval
from experiments.resumable import digest, file_digest, train_digest, train_exact
from policy.tiny import TinyModel, TinyPolicy
from policy.uniform import RandomPolicy

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "world_mix"


def seeded(cfg: TrainConfig, seed: int) -> TrainConfig:
    return msgspec.convert({**msgspec.to_builtins(cfg), "seed": seed}, TrainConfig)


def held_out(cfg: TrainConfig, world: WorldEntry, instances: int) -> list[EpisodeConfig]:
    """``instances`` task instances per team size, world seeds apart from training's, at the
    world's last time limit, run as training runs them (latency, tokens, temperature)."""
    return [
        EpisodeConfig(
            world=world.world,
            params=dict(world.params),
            agents=team,
            world_seed=10_000 + k,
            sample_seed=k,
            time_limit=world.time_limit_end,
            max_output_tokens=cfg.max_output_tokens,
            temperature=cfg.temperature,
        )
        for team in world.team_sizes
        for k in range(instances)
    ]


def scores(configs: list[EpisodeConfig], policy: Any) -> list[float]:
    return [e.score for e in run_episodes(configs, policy, concurrency=16)]


def _train(args: tuple[str, str]) -> str:
    cfg = msgspec.json.decode(args[0], type=TrainConfig)
    return train_exact(cfg, Path(args[1]), log=lambda _: None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "mix.toml")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--instances", type=int, default=12, help="held-out instances a team size")
    p.add_argument("--jobs", type=int, default=2, help="training runs at once")
    p.add_argument("--quick", action="store_true", help="2 seeds x 4 steps: the machinery only")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    base = load_config(a.config)
    seeds, instances = (2, 4) if a.quick else (a.seeds, a.instances)
    if base.mix is None:
        print(f"{a.config}: no [[worlds]] tables: this study is about a mix", file=sys.stderr)
        return 2
    if a.quick:
        quick = msgspec.structs.replace(base.mix, baseline_episodes=2)
        base = msgspec.structs.replace(base, steps=4, mix=quick)
    out = a.out or (OUT / "quick" if a.quick else OUT)
    runs = {s: out / "runs" / f"seed{s}" for s in range(seeds)}
    configs = {s: seeded(base, s) for s in runs}
    jobs = [(msgspec.json.encode(configs[s]).decode(), str(runs[s])) for s in runs]
    ctx = multiprocessing.get_context("spawn")  # (a child of a process torch has used: spawn)
    with ctx.Pool(max(1, min(a.jobs, len(jobs)))) as workers:
        done = list(tqdm(workers.imap(_train, jobs), total=len(jobs), desc="train", unit="run"))
    print("training:", dict(zip((f"seed{s}" for s in runs), done, strict=True)))

    summary: dict[str, Any] = {
        "config": str(a.config.relative_to(ROOT) if a.config.is_relative_to(ROOT) else a.config),
        "seeds": seeds,
        "steps": base.steps,
        "instances_per_team": instances,
        "worlds": {},
    }
    measure = out / "measured.json"
    kept = json.loads(measure.read_text()) if measure.exists() else {}
    parts = [(w, s) for w in mix(base) for s in runs]
    bar = tqdm(total=len(parts) + len(mix(base)), desc="measure", unit="part")
    tables: dict[str, dict[str, list[list[float]]]] = {}
    for w in mix(base):
        cfgs = held_out(base, w, instances)
        key = digest("random", w.label, msgspec.to_builtins(cfgs))
        if kept.get(f"{w.label}|random", {}).get("digest") != key:
            kept[f"{w.label}|random"] = {"digest": key, "scores": scores(cfgs, RandomPolicy())}
        bar.update()
        table: dict[str, list[list[float]]] = {"random": [kept[f"{w.label}|random"]["scores"]]}
        for s in runs:
            ckpt = runs[s] / "checkpoints" / "latest.pt"
            key = digest(
                w.label, train_digest(configs[s]), file_digest(ckpt), msgspec.to_builtins(cfgs)
            )
            name = f"{w.label}|seed{s}"
            if kept.get(name, {}).get("digest") != key:
                kept[name] = {
                    "digest": key,
                    "untrained": scores(cfgs, TinyPolicy(TinyModel.fresh(configs[s].tiny))),
                    "trained": scores(cfgs, TinyPolicy(TinyModel.load(ckpt))),
                }
                measure.write_text(json.dumps(kept) + "\n")
            table.setdefault("untrained", []).append(kept[name]["untrained"])
            table.setdefault("trained", []).append(kept[name]["trained"])
            bar.update()
        measure.write_text(json.dumps(kept) + "\n")
        tables[w.label] = table
        gain = paired_contrast(table["trained"], table["untrained"])
        over_random = paired_contrast(table["trained"], table["random"])
        summary["worlds"][w.label] = {
            "random": float(np.mean(table["random"])),
            "untrained": msgspec.to_builtins(seed_interval(np.mean(table["untrained"], axis=1))),
            "trained": msgspec.to_builtins(seed_interval(np.mean(table["trained"], axis=1))),
            "trained_minus_untrained": msgspec.to_builtins(gain),
            "trained_minus_random": msgspec.to_builtins(over_random),
            "improves": gain.lo is not None and gain.lo > 0,
        }
    bar.close()
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for label, r in summary["worlds"].items():
        g = r["trained_minus_untrained"]
        print(
            f"{label}: random {r['random']:.3f}, untrained {r['untrained']['mean']:.3f}, "
            f"trained {r['trained']['mean']:.3f}; trained - untrained {g['mean']:.3f} "
            f"[{g['lo']:.3f}, {g['hi']:.3f}] over {seeds} seeds: "
            f"{'improves' if r['improves'] else 'not shown to improve'}"
        )
    plot(summary, out / "world_mix.png")
    print(f"wrote {out}")
    return 0


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = list(summary["worlds"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, kind in enumerate(("random", "untrained", "trained")):
        means, errs = [], []
        for w in worlds:
            r = summary["worlds"][w][kind]
            m = r if isinstance(r, float) else r["mean"]
            lo = m if isinstance(r, float) or r["lo"] is None else r["lo"]
            means.append(m)
            errs.append(m - lo)
        xs = [j + (i - 1) * 0.27 for j in range(len(worlds))]
        ax.bar(xs, means, 0.27, yerr=errs, capsize=3, label=kind)
    ax.set_xticks(range(len(worlds)), worlds)
    ax.set(
        ylabel="held-out score (95% t-interval over seeds)",
        title=f"One run over {len(worlds)} worlds: {summary['seeds']} seeds x "
        f"{summary['steps']} steps, each world measured held out",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

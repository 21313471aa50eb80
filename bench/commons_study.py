"""Goods that outlive an episode: does a commons help, and does measured credit teach the turns
that feed it? (issue 30, item 3)

Trains ``configs/commons.toml`` (the library world: lock keys recur across episodes, and
``publish`` puts one in the commons for later episodes at a cost to its own) at ``--seeds``
training seeds under three conditions: ``commons = "off"`` (no commons), ``"on"`` (kept across
the run, no credit) and ``"credit"`` (the turns that feed it paid their measured value).

Every policy is then measured through one protocol, a held-out **chain**: ``--batches`` batches
of ``--batch`` episodes on task instances never trained on, starting from an empty commons; each
batch starts from what the batches before it contributed (the newest ``commons_size``), as in
training. The chain's score is what a policy earns by building and using the commons together.
Beside the trained policies, the same chain is played by random, each seed's untrained weights,
and two scripts (``policy.scripted.LibraryScript``): one that publishes every lock it opens and
one that never does. Contrasts are paired by seed and chain episode, with a t-interval over the
seeds (``collective.studies.intervals``).

    python bench/commons_study.py            # 4 seeds x 3 conditions x 40 steps, ~30 min
    python bench/commons_study.py --quick    # 2 seeds x 2 steps: the machinery only

Writes ``bench/results/commons/`` (``summary.json``, ``commons.png``, ``runs/``); runs and
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

from collective.engine.conductor import run_episodes
from collective.rl.commons import CommonsStore
from collective.rl.config import CommonsOn, TrainConfig, load_config, mix
from collective.rl.rollouts import episode_config
from collective.studies.intervals import interval_text, paired_contrast, seed_interval
from experiments.resumable import digest, file_digest, train_digest, train_exact
from policy.scripted import LibraryScript, ScriptedPolicy
from policy.tiny import TinyModel, TinyPolicy
from policy.uniform import RandomPolicy

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "commons"
CONDITIONS = ("off", "on", "credit")


def variant(cfg: TrainConfig, seed: int, commons: str) -> TrainConfig:
    fields = {**msgspec.to_builtins(cfg), "seed": seed, "commons": commons}
    credit_only = ("commons_credit_entries", "commons_credit_reruns", "commons_discount")
    for k in (("commons_size",) if commons == "off" else ()) + (
        () if commons == "credit" else credit_only
    ):
        fields.pop(k)
    return msgspec.convert(fields, TrainConfig)


def chain(cfg: TrainConfig, policy: Any, batches: int, batch: int) -> dict[str, list[float]]:
    """The held-out chain: ``batches`` batches of ``batch`` episodes, each batch starting from
    the commons the batches before it made (``cfg``'s commons settings, as in training)."""
    store_cfg = msgspec.structs.replace(cfg, commons=CommonsOn(), groups_per_step=1, lag=0)
    store = CommonsStore(store_cfg, "library")
    (world,) = mix(cfg)
    out: dict[str, list[float]] = {"score": [], "added": [], "used": []}
    for b in range(batches):
        configs = [
            store.apply(
                episode_config(
                    cfg,
                    world,
                    world.team_sizes[k % len(world.team_sizes)],
                    world_seed=50_000 + b * batch + k,
                    sample_seed=b * batch + k,
                    time_limit=world.time_limit_end,
                    version=-1,
                ),
                b,
            )
            for k in range(batch)
        ]
        eps = run_episodes(configs, policy, concurrency=batch)
        out["score"] += [e.score for e in eps]
        out["added"] += [e.world_metrics.get("commons_added", 0.0) for e in eps]
        out["used"] += [e.world_metrics.get("commons_used", 0.0) for e in eps]
        store.merge(b, [eps])
    return out


def _train(args: tuple[str, str]) -> str:
    cfg = msgspec.json.decode(args[0], type=TrainConfig)
    return train_exact(cfg, Path(args[1]), log=lambda _: None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "commons.toml")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batches", type=int, default=8, help="batches of the held-out chain")
    p.add_argument("--batch", type=int, default=8, help="episodes a batch of the chain")
    p.add_argument("--jobs", type=int, default=2, help="training runs at once")
    p.add_argument("--quick", action="store_true", help="2 seeds x 2 steps: the machinery only")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    base = msgspec.structs.replace(load_config(a.config), steps=2 if a.quick else a.steps)
    if base.world != "library" or base.commons == "off":
        print(f"{a.config}: this study trains the library with a commons", file=sys.stderr)
        return 2
    seeds = 2 if a.quick else a.seeds
    batches, batch = (2, 4) if a.quick else (a.batches, a.batch)
    out = a.out or (OUT / "quick" if a.quick else OUT)
    runs = {(c, s): out / "runs" / f"{c}-s{s}" for s in range(seeds) for c in CONDITIONS}
    configs = {(c, s): variant(base, s, c) for c, s in runs}
    jobs = [(msgspec.json.encode(configs[k]).decode(), str(runs[k])) for k in runs]
    ctx = multiprocessing.get_context("spawn")  # (a child of a process torch has used: spawn)
    with ctx.Pool(max(1, min(a.jobs, len(jobs)))) as workers:
        done = list(tqdm(workers.imap(_train, jobs), total=len(jobs), desc="train", unit="run"))
    print("training:", dict(zip((r.name for r in runs.values()), done, strict=True)))

    measure = out / "measured.json"
    kept = json.loads(measure.read_text()) if measure.exists() else {}
    protocol = {"batches": batches, "batch": batch, "commons_size": base.commons_size}

    def measured(name: str, key: str, play: Any) -> dict[str, list[float]]:
        if kept.get(name, {}).get("digest") != key:
            kept[name] = {"digest": key, **play()}
            measure.write_text(json.dumps(kept) + "\n")
        return kept[name]

    tables: dict[str, dict[str, list[list[float]]]] = {}

    def add(kind: str, got: dict[str, list[float]]) -> None:
        for field in ("score", "added", "used"):
            tables.setdefault(field, {}).setdefault(kind, []).append(got[field])

    fixed = {
        "random": RandomPolicy(),
        "script_publishes": ScriptedPolicy(LibraryScript(publish=True)),
        "script_never_publishes": ScriptedPolicy(LibraryScript(publish=False)),
    }
    bar = tqdm(total=len(fixed) + seeds * (1 + len(CONDITIONS)), desc="measure", unit="chain")
    for name, policy in fixed.items():
        key = digest(name, protocol, msgspec.to_builtins(base))
        add(name, measured(name, key, lambda policy=policy: chain(base, policy, batches, batch)))
        bar.update()
    for s in range(seeds):
        untrained = TinyModel.fresh(configs[("off", s)].tiny)
        key = digest("untrained", protocol, train_digest(configs[("off", s)]))
        add(
            "untrained",
            measured(
                f"untrained-s{s}",
                key,
                lambda m=untrained: chain(base, TinyPolicy(m), batches, batch),
            ),
        )
        bar.update()
        for c in CONDITIONS:
            ckpt = runs[(c, s)] / "checkpoints" / "latest.pt"
            key = digest(c, protocol, train_digest(configs[(c, s)]), file_digest(ckpt))
            add(
                c,
                measured(
                    f"{c}-s{s}",
                    key,
                    lambda ckpt=ckpt: chain(base, TinyPolicy(TinyModel.load(ckpt)), batches, batch),
                ),
            )
            bar.update()
    bar.close()

    score = tables["score"]

    def contrast(x: str, y: str) -> dict[str, Any]:
        return msgspec.to_builtins(paired_contrast(score[x], score[y]))

    summary: dict[str, Any] = {
        "config": str(a.config.relative_to(ROOT) if a.config.is_relative_to(ROOT) else a.config),
        "seeds": seeds,
        "steps": base.steps,
        "chain": protocol,
        "figures": {
            field: {k: msgspec.to_builtins(seed_interval(np.mean(v, axis=1))) for k, v in t.items()}
            for field, t in tables.items()
        },
        "contrasts": {
            "credit - on": contrast("credit", "on"),
            "on - off": contrast("on", "off"),
            "credit - off": contrast("credit", "off"),
            "script_publishes - script_never_publishes": contrast(
                "script_publishes", "script_never_publishes"
            ),
            **{f"{k} - untrained": contrast(k, "untrained") for k in CONDITIONS},
            **{f"{k} - random": contrast(k, "random") for k in CONDITIONS},
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"the held-out chain ({batches} batches of {batch}, from an empty commons), "
        f"{seeds} seeds x {base.steps} steps:"
    )
    for k in summary["figures"]["score"]:
        f = summary["figures"]
        print(
            f"  {k:23s} score {interval_text(f['score'][k])}  published/episode "
            f"{f['added'][k]['mean']:.2f}  recalled/episode {f['used'][k]['mean']:.2f}"
        )
    for k, r in summary["contrasts"].items():
        print(f"  {k:42s} {interval_text(r)}")
    plot(summary, out / "commons.png")
    print(f"wrote {out}")
    return 0


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, field, label in (
        (axes[0], "score", "held-out chain score"),
        (axes[1], "added", "entries published per episode"),
    ):
        figs = summary["figures"][field]
        kinds = list(figs)
        means = [figs[k]["mean"] for k in kinds]
        errs = [0.0 if figs[k]["lo"] is None else figs[k]["mean"] - figs[k]["lo"] for k in kinds]
        ax.bar(range(len(kinds)), means, yerr=errs, capsize=3, color="#4a7")
        ax.set_xticks(range(len(kinds)), [k.replace("_", "\n") for k in kinds], fontsize=7)
        ax.set(ylabel=label + " (95% t over seeds)")
    fig.suptitle(
        f"The library's commons: off / on / credit, {summary['seeds']} seeds x "
        f"{summary['steps']} steps, measured on one held-out chain"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

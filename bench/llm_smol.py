"""The LLM recipe on a real pretrained model: does RLCR with LoRA move SmolLM2-135M-Instruct on
tally, held out, beside its own untrained weights, random, and a script?

    python bench/llm_smol.py                   # 2 seeds x 10 steps, 24 held-out instances
    python bench/llm_smol.py --quick --out /tmp/smol   # 1 seed x 1 step, 4 instances

Trains ``configs/llm-smol.toml`` (LoRA rank 8 on tally, two agents, 60 simulated seconds) once
per seed with ``collective train`` in its own process (``--jobs`` at once; a run already there
resumes or is reused: the runs live in ``--runs``, default ``runs/llm_smol``, since each
checkpoint is the 517 MB merged model). Then plays the same held-out instances (world seeds
90,000 + i, never a training draw) with

- **trained**: each seed's ``checkpoints/latest``, sampling seeds its own;
- **untrained**: the starting weights, with the same seed's sampling seeds, so trained and
  untrained are paired by seed and instance;
- **random**: a uniformly random grammar-valid action;
- **script**: ``add 3`` every turn, the world's obvious ceiling (what a policy that only
  learned to add 3 would score: a "yes" a script earns too is no coordination).

Contrasts are paired by seed and instance (``collective.studies.intervals.paired_contrast``: the
mean of per-seed mean differences, its t-interval over seeds, so with two seeds an interval is
wide by construction), and beside it a hierarchical bootstrap of the paired differences (seeds,
then each seed's instances, resampled: ``hierarchical_bootstrap``), whose interval counts the
instances' variation as well as the seeds'. Besides the score: the share of turns that are an
``add``, the mean amount added, the share of turns that were not a valid action, and talk tokens
per episode. Writes
``bench/results/llm_smol/``: ``summary.json``, ``llm_smol.png`` (held-out scores and the
training curves) and the ``collective show`` timeline of one trained held-out episode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from collective.base.outputs import write_file
from collective.records import Episode
from collective.rl.config import TrainConfig, load_config
from collective.rl.rundir import read_metrics
from collective.studies.intervals import hierarchical_bootstrap, paired, paired_contrast
from experiments.resumable import is_complete

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "llm_smol"
CONFIG = ROOT / "configs" / "llm-smol.toml"
HELD_OUT = 90_000  # world seeds of the held-out instances (training draws are 2**31-wide)


def train(cfg_path: Path, runs: Path, seeds: list[int], steps: int | None, jobs: int) -> None:
    """Each seed's run, ``jobs`` at once, each its own ``collective train`` (resumable)."""
    pending = [s for s in seeds if not _complete(runs / f"s{s}", steps)]
    live: list[tuple[int, subprocess.Popen[bytes], Any]] = []
    t0 = time.monotonic()
    while pending or live:
        while pending and len(live) < jobs:
            s = pending.pop(0)
            out = runs / f"s{s}"
            out.parent.mkdir(parents=True, exist_ok=True)
            log = open(runs / f"train-s{s}.log", "ab")  # noqa: SIM115 (closed below)
            cmd = [sys.executable, "-m", "collective.cli", "train"]
            if (out / "config.json").exists():  # cut short: it resumes with its own config
                cmd += ["--resume", str(out)]
            else:
                cmd += [str(cfg_path), "--out", str(out), "--set", f"seed={s}"]
            cmd += ["--set", f"steps={steps}"] if steps else []
            print(f"[train] seed {s} -> {out}", flush=True)
            live.append((s, subprocess.Popen(cmd, stdout=log, stderr=log), log))
        time.sleep(5)
        for item in list(live):
            s, proc, log = item
            if proc.poll() is None:
                continue
            live.remove(item)
            log.close()
            if proc.returncode != 0:
                raise SystemExit(f"llm_smol: training seed {s} failed (see {runs}/train-s{s}.log)")
            n = len(read_metrics(runs / f"s{s}"))
            print(f"[train] seed {s}: {n} steps ({(time.monotonic() - t0) / 60:.1f} min)")


def _complete(run: Path, steps: int | None) -> bool:
    """Whether ``run`` began (``config.json``) and finished ``steps`` (default: its own
    config's, as a resume reads it)."""
    if not (run / "config.json").exists():
        return False
    return is_complete(run, load_config(run / "config.toml", [f"steps={steps}"] if steps else []))


def held_out(cfg: TrainConfig, policy: Any, instances: int, seed: int) -> list[Episode]:
    """The held-out instances played by ``policy``; sampling seeds ``seed``'s own."""
    from collective import run_episodes
    from collective.replay import tokenizer_of
    from collective.rl.rollouts import episode_config

    world = cfg.worlds[0]
    name, tok = getattr(policy, "name", "policy"), tokenizer_of(policy)
    cfgs = [
        msgspec.structs.replace(
            episode_config(
                cfg,
                world,
                world.team_sizes[0],
                world_seed=HELD_OUT + i,
                sample_seed=1_000 * (seed + 1) + i,
                time_limit=world.time_limit_start,
                version=int(getattr(policy, "version", 0)),  # the weights it holds
            ),
            policy=name,
            tokenizer=tok,
        )
        for i in range(instances)
    ]
    return run_episodes(cfgs, policy, concurrency=instances)


def figures(eps: list[Episode]) -> dict[str, list[float]]:
    """Per-episode figures (one value an instance, in instance order)."""
    from collective.records.signs import signs

    out: dict[str, list[float]] = {"score": [], "add_share": [], "add_amount": []}
    out |= {"invalid_share": [], "talk_tokens": []}
    for ep in eps:
        acts = [t for t in ep.turns if t.tool]
        adds = [t for t in acts if t.tool == "add"]
        amounts = [float(t.text.split()[-1]) for t in adds if t.text.split()[-1].isdigit()]
        sg = signs(ep)
        out["score"].append(float(ep.score))
        out["add_share"].append(len(adds) / max(1, len(acts)))
        out["add_amount"].append(float(np.mean(amounts)) if amounts else 0.0)
        out["invalid_share"].append(  # malformed or outside the grammar's reach
            sum(t.kind == "invalid" for t in ep.turns) / max(1, len(ep.turns))
        )
        out["talk_tokens"].append(float(sg.talk_tokens))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="1 seed x 1 step, 4 instances")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="training steps (default: the config's)")
    ap.add_argument("--instances", type=int, default=24, help="held-out instances")
    ap.add_argument("--jobs", type=int, default=2, help="training runs at once")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "llm_smol")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--baselines-only",
        action="store_true",
        help="train nothing: play random, the script and the untrained model (kept for later)",
    )
    a = ap.parse_args(argv)
    for flag, v in (("--seeds", a.seeds), ("--instances", a.instances), ("--jobs", a.jobs)):
        if v < 1:
            ap.error(f"{flag} must be at least 1, got {v}")
    if a.steps < 0:
        ap.error(f"--steps must be at least 0, got {a.steps}")
    if not a.config.is_file():
        ap.error(f"--config {a.config}: no such file")
    seeds = list(range(1 if a.quick else a.seeds))
    steps = 1 if a.quick else (a.steps or None)
    instances = 4 if a.quick else a.instances
    cfg = load_config(a.config)
    t0 = time.monotonic()
    if a.baselines_only:
        evaluate(cfg, a.runs, seeds, instances, a.out, baselines_only=True)
        return 0
    train(a.config, a.runs, seeds, steps, a.jobs)
    result = evaluate(cfg, a.runs, seeds, instances, a.out)
    result |= {
        "config": str(a.config.relative_to(ROOT) if a.config.is_relative_to(ROOT) else a.config)
    }
    result |= {"seeds": seeds, "instances": instances, "minutes": (time.monotonic() - t0) / 60}
    a.out.mkdir(parents=True, exist_ok=True)
    write_file(a.out / "summary.json", (json.dumps(result, indent=1) + "\n").encode())
    plot(result, a.out / "llm_smol.png")
    print(f"wrote {a.out} in {result['minutes']:.1f} min")
    return 0


def evaluate(
    cfg: TrainConfig,
    runs: Path,
    seeds: list[int],
    instances: int,
    out: Path,
    baselines_only: bool = False,
) -> dict[str, Any]:
    """Every policy on the held-out instances; paired contrasts of the trained policy."""
    from collective.records import save_episode
    from policy.hf.policy import load_hf_policy
    from policy.scripted import ScriptedPolicy
    from policy.uniform import RandomPolicy

    model = cfg.model.path  # type: ignore[union-attr]
    tables: dict[str, dict[str, list[list[float]]]] = {}

    def played(name: str, seed: int, policy: Callable[[], Any], tag: str = "") -> None:
        """``name``'s held-out figures on ``seed``'s instances, played once and kept in
        ``runs/held-out/`` (a rerun, or a run cut short, re-uses them)."""
        path = runs / "held-out" / f"{name}-s{seed}{tag}-n{instances}.json"
        if not path.exists():
            eps = held_out(cfg, policy(), instances, seed)
            if name == "trained" and seed == seeds[0]:  # one, as `collective show` prints it
                save_episode(eps[0], runs / "trained-episode.msgpack")
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file(path, json.dumps(figures(eps)).encode())
        for k, v in json.loads(path.read_text()).items():
            tables.setdefault(name, {}).setdefault(k, []).append(v)
        row = tables[name]["score"][-1]
        print(f"[held out] {name} s{seed}: score {np.mean(row):.3f} ({len(row)} instances)")

    played("random", 0, RandomPolicy)
    played("script", 0, lambda: ScriptedPolicy(lambda r: "add 3", "script: add 3"))
    untrained = cache(partial(load_hf_policy, model))  # loaded once, for every seed
    for s in seeds:
        played("untrained", s, untrained)
    if baselines_only:  # (their figures are kept in runs/held-out for the full run)
        return {}
    metrics = {s: read_metrics(runs / f"s{s}") for s in seeds}
    for s in seeds:
        latest = str(runs / f"s{s}" / "checkpoints" / "latest")
        played("trained", s, partial(load_hf_policy, latest), f"-step{len(metrics[s])}")
    cmd = [sys.executable, "-m", "collective.cli", "show", str(runs / "trained-episode.msgpack")]
    shown = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    out.mkdir(parents=True, exist_ok=True)
    write_file(out / "trained-episode.txt", shown.encode())
    contrasts = {}
    for k in tables["trained"]:
        t = tables["trained"][k]
        contrasts[k] = {
            "trained - untrained": _contrast(t, tables["untrained"][k]),
            "trained - random": _contrast(t, tables["random"][k]),
            "untrained - random": _contrast(tables["untrained"][k], tables["random"][k]),
            "trained - script": _contrast(t, tables["script"][k]),
        }
    curves = {str(s): [m.return_mean for m in metrics[s]] for s in seeds}
    facts = {
        str(s): {
            k: [getattr(m, k) for m in metrics[s]]
            for k in (
                "ratio_mean",
                "clip_fraction",
                "learner_seconds",
                "wall_time",
                "resampled_groups",
            )
        }
        for s in seeds
    }
    means = {p: {k: float(np.mean(v)) for k, v in t.items()} for p, t in tables.items()}
    return {
        "means": means,
        "contrasts": contrasts,
        "tables": tables,
        "curves": curves,
        "training": facts,
    }


def _contrast(a: list[list[float]], b: list[list[float]]) -> dict[str, Any]:
    """``a - b`` paired by seed and instance: the t-interval over the seeds' mean differences,
    and a hierarchical bootstrap of the differences (seeds, then each seed's instances,
    resampled), whose interval counts the instances' variation too."""
    iv = paired_contrast(a, b)
    both = hierarchical_bootstrap(paired(a, b)) if iv.mean is not None else iv
    return {
        "mean": iv.mean,
        "lo": iv.lo,
        "hi": iv.hi,
        "per_seed": list(iv.per_seed),
        "lo_with_instances": both.lo,
        "hi_with_instances": both.hi,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    from collective.base.outputs import save_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["random", "untrained", "trained", "script"]
    tables = result["tables"]
    for i, name in enumerate(names):
        rows = np.asarray(tables[name]["score"])
        left.bar(i, rows.mean(), color=f"C{i}", alpha=0.6)
        for r in rows:
            left.scatter([i] * len(r), r, s=6, color="k", alpha=0.3)
    left.set_xticks(range(len(names)), names)
    left.set_ylabel("held-out score (tally, 2 agents, 60 s)")
    left.set_title("SmolLM2-135M-Instruct, LoRA 8")
    for s, curve in result["curves"].items():
        right.plot(range(len(curve)), curve, marker="o", label=f"seed {s}")
    right.set_xlabel("step")
    right.set_ylabel("training return (mean of the step's episodes)")
    right.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())

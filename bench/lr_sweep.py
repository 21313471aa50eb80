"""Which learning rate keeps what RL finds: a short sweep from the study's prior.

The third edition trained at 1e-2 with Adam, whose normalised step moved the weight tensors by
about half their mean magnitude a step: from a policy that already passed keys, four steps fell
from 0.248 held-out to 0.082 (the review behind issue 43). This sweep trains the signs-of-life
main config (the fourth edition's: from the prior ``bench/results/prior``, groups of 4, dynamic
sampling) for a few steps at each rate, two seeds each, and measures every run held out on the
study's instances beside the prior itself: the held-out score, the keys taught, the entropy per
token at the last step and how far the weights moved (relative L2 distance from the prior).
The study takes its rate from here: the largest rate whose held-out score does not fall below
the prior's on any seed, and whose entropy keeps above half the prior's.

    python bench/lr_sweep.py                 # 4 rates x 2 seeds x 12 steps (~40 CPU-min)
    python bench/lr_sweep.py --quick --out /tmp/lr

Writes ``bench/results/lr_sweep/``: ``summary.json`` and ``lr_sweep.png``; resumable run by
run (the study's digests).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from collective.base.outputs import write_file
from collective.rl.train import read_metrics
from experiments import signs_of_life as sol
from policy.tiny import TinyModel

OUT = Path(__file__).resolve().parent / "results" / "lr_sweep"
RATES = (3e-4, 1e-3, 3e-3, 1e-2)


def moved(run: Path, prior: Path) -> float:
    """Relative L2 distance of the run's last weights from the prior's."""
    a = TinyModel.load(prior).net.state_dict()
    b = TinyModel.load(run / "checkpoints" / "latest.pt").net.state_dict()
    num = sum(float(((b[k] - a[k]) ** 2).sum()) for k in a)
    den = sum(float((a[k] ** 2).sum()) for k in a)
    return (num / den) ** 0.5


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--instances", type=int, default=8, help="held-out instances a team size")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    steps = 2 if a.quick else a.steps
    seeds = list(range(1 if a.quick else a.seeds))
    n = 2 if a.quick else a.instances
    rates = RATES[:2] if a.quick else RATES
    t0 = time.perf_counter()
    base = sol.base_config(a.quick, steps)
    specs = {f"lr{lr:g}": {**base, "learning_rate": lr, "snapshot_every": steps} for lr in rates}
    runs = sol.run_all(a.out, specs, seeds, a.jobs)
    prior = Path(base["init"])
    rows: dict[str, Any] = {}
    ev_prior = sol.evaluate(runs[f"lr{rates[0]:g}"][:1], "untrained", n, sol.EVAL_T)
    prior_score = float(ev_prior["score"].mean())
    for lr in rates:
        name = f"lr{lr:g}"
        ev = sol.evaluate(runs[name], "trained", n, sol.EVAL_T)
        last = [read_metrics(r)[-1] for r in runs[name]]
        rows[name] = {
            "learning_rate": lr,
            "heldout_score": ev["score"].mean(axis=(1, 2)).tolist(),  # per seed
            "keys_taught": ev["taught"].mean(axis=(1, 2)).tolist(),
            "talk_per_agent_second": ev["comm"].mean(axis=(1, 2)).tolist(),
            "entropy_last": [m.entropy for m in last],
            "moved": [moved(r, prior) for r in runs[name]],
            "steps_without_signal": [
                sum(1 for m in read_metrics(r) if not m.optimiser_step) for r in runs[name]
            ],
        }
        print(f"[{name}] {json.dumps(rows[name])}", flush=True)
    summary = {
        "prior": {
            "heldout_score": prior_score,
            "keys_taught": float(ev_prior["taught"].mean()),
            "talk_per_agent_second": float(ev_prior["comm"].mean()),
        },
        "steps": steps,
        "seeds": seeds,
        "instances_per_team": n,
        "rates": rows,
        "wall_seconds": time.perf_counter() - t0,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    write_file(a.out / "summary.json", json.dumps(summary, indent=1).encode(), "summary")
    plot(a.out, summary)
    return 0


def plot(out: Path, s: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, key, title in zip(
        axes,
        ("heldout_score", "keys_taught", "entropy_last"),
        ("held-out score", "keys taught / episode", "entropy / token (last step)"),
        strict=True,
    ):
        for row in s["rates"].values():
            ys = row[key]
            ax.scatter([row["learning_rate"]] * len(ys), ys, color="C0")
            ax.plot([row["learning_rate"]], [np.mean(ys)], "k_", markersize=14)
        if key in ("heldout_score", "keys_taught"):
            prior = s["prior"][key]
            ax.axhline(prior, color="C1", ls="--", label="the prior (step 0)")
            ax.legend(fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_title(title)
    fig.suptitle(f"{s['steps']} steps from the prior, seeds {s['seeds']} (dots), mean (bar)")
    fig.tight_layout()
    fig.savefig(out / "lr_sweep.png", dpi=110)


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())

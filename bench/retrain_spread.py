"""How much a retrain of one config varies, beside how much seeds do.

Retrains a finished training run's own config (its ``config.toml``) in a fresh folder for the
first ``--steps`` steps (stopped there, as an interrupted run would be) and compares, field by
field, every metrics line but the wall-clock ones and the checkpoint's weights at that step
with the original's. Under one commit a run is a function of its config (docs/training.md),
so the retrain-to-retrain spread is zero by construction; this checks it on the study's own
runs. The third edition's retrains differed because the code between them did (the ISA pin);
that spread is a spread between commits, reported in its DISCUSSION.

    python bench/retrain_spread.py bench/results/signs_of_life/runs/main-s0 --steps 25
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from collective.rl.config import load_config
from collective.rl.rundir import snapshot_name
from collective.rl.train import train
from collective.studies.rerun import comparable
from policy.tiny import TinyModel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("run", type=Path, help="a finished training run")
    ap.add_argument("--steps", type=int, default=25, help="steps to retrain (a kept snapshot)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = load_config(a.run / "config.toml")
    snap = a.run / "checkpoints" / f"{snapshot_name(a.steps)}.pt"
    if not snap.is_file():
        ap.error(f"{a.run} keeps no checkpoint after {a.steps} steps ({snap.name})")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        again = Path(tmp) / "retrain"
        train(cfg, again, progress=True, stop_after=a.steps)
        first = comparable(a.run)[: a.steps]
        second = comparable(again)
        differing = sorted(
            {k for x, y in zip(first, second, strict=True) for k in x if x[k] != y[k]}
        )
        w1 = TinyModel.load(snap).net.state_dict()
        w2 = TinyModel.load(again / "checkpoints" / f"{snapshot_name(a.steps)}.pt").net.state_dict()
        same_weights = all(torch.equal(w1[k], w2[k]) for k in w1)
    out = {
        "run": str(a.run),
        "steps": a.steps,
        "metrics_fields_differing": differing,
        "weights_identical": same_weights,
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out))
    return 0 if same_weights and not differing else 1


if __name__ == "__main__":
    sys.exit(main())

"""The signs-of-life study's starting prior, made and measured before any RL (fourth edition).

The recipe, named in advance (``policy.scripted.PriorScript``): a script that works its own desk
sensibly and, on 15% of its turns, messages a random teammate one to three words drawn uniformly
from the world's lexicon (key names among them), so that keys are named only by chance. Its
episodes are played on training instances (world seeds 0..N, never the held-out ones, which
start at 90,000), every team size of the study alike, at limits spread over the study's
schedule (90 to 180 s); the tiny model of the study (``MODEL``: context 256) imitates them by
``collective sft``. Then, before any RL, this measures the prior beside the untrained byte
model on held-out instances: score, talk, keys taught, and the probability the model gives the
shortest teaching action (agent 0, who holds every key, saying ``msg A "kJ"``), the action the
third edition's review found the untrained model reaches with probability ~2e-8.

    python bench/prior.py                  # episodes, imitation, measurement (~15 CPU-min)
    python bench/prior.py --quick --out /tmp/prior

Writes ``bench/results/prior/``: ``prior/latest.pt`` (what the study starts from),
``prior/sft.json`` (its provenance: every episode's digest), ``summary.json``, ``README.md``.
The episodes are regenerated from their seeds (not committed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import msgspec
import torch

from collective.base.outputs import write_file
from experiments.prior import SFT, make_prior, measure
from experiments.setting import MODEL
from policy.tiny import TinyModel, TinyPolicy

OUT = Path(__file__).resolve().parent / "results" / "prior"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="20 episodes, 1 epoch, 4 instances")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--instances", type=int, default=16, help="held-out instances a team size")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    n_eps = 20 if a.quick else a.episodes
    sft_cfg = msgspec.structs.replace(SFT, epochs=1) if a.quick else SFT
    t0 = time.process_time()
    checkpoint, epochs = make_prior(a.out, n_eps, sft_cfg)
    print(f"[prior] {epochs[-1]} ({time.process_time() - t0:.0f} CPU-s)", file=sys.stderr)
    n = 4 if a.quick else a.instances
    prior = TinyModel.load(checkpoint)
    untrained = TinyModel.fresh(MODEL)
    summary = {
        "recipe": "policy.scripted.PriorScript(talk=0.15), imitated by collective sft",
        "sft": msgspec.to_builtins(sft_cfg),
        "epochs": [msgspec.to_builtins(e) for e in epochs],
        "episodes": n_eps,
        "instances_per_team": n,
        "script": measure("script", n, None),
        "prior": measure(TinyPolicy(prior), n, prior),
        "untrained": measure(TinyPolicy(untrained), n, untrained),
        "cpu_seconds": time.process_time() - t0,
    }
    write_file(a.out / "summary.json", json.dumps(summary, indent=1).encode(), "summary")
    print(json.dumps({k: summary[k] for k in ("script", "prior", "untrained")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

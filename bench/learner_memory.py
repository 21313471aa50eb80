"""The learner's backward-pass memory per token on a real model: the slope the memory guard
(``collective.engine.limits.BACKWARD_TOKEN_BYTES``) counts a token budget with.

Each case runs one learner step (forward, masked logprobs, loss, backward, AdamW) in a fresh
process over ``tokens`` prompt + output tokens in one backward pass, on a model directory (LoRA
or full), with gradient checkpointing on or off, and reads the process's peak resident memory
above what it held before the step (``experiments.learner_cost``: its peak reset, and glibc's
fixed mmap threshold so freed tensors leave the resident set). The slope between two sizes is
the memory a token of a backward pass takes; divided by the model's layers x hidden width, it
is the per-unit figure the guard scales to another model.

    python bench/learner_memory.py --model /tmp/smol --lora 8
        [--sizes 1024 4096] [--out bench/results/learner_memory/smollm2-135m.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collective.base.args import positive  # noqa: E402


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    import torch

    from collective.rl.config import TrainConfig
    from collective.rl.learner import Learner
    from experiments.learner_cost import _peak_rss, _reset_peak_rss, _rss, samples_for
    from policy.hf.model import HFModel

    torch.set_num_threads(1)
    model = HFModel.load(
        case["model"],
        lora_rank=case["lora"],
        gradient_checkpointing=case["checkpointing"],
        batch_size=64,
    )
    per = 256  # a tally prompt's tokens, about
    samples = samples_for(model, case["tokens"] // per, per, 8)
    learner = Learner(model, TrainConfig(learning_rate=1e-5, chunk=512))
    learner.step(samples[:1])  # warm-up: kernels, optimiser state, allocator
    base = _rss()
    fresh = _reset_peak_rss()
    learner.step(samples)
    config = model.causal.config
    return {
        **case,
        "peak_bytes": max(_peak_rss() - base, 0),
        "peak_of": "the step" if fresh else "the process (an upper bound)",
        "layers": int(config.num_hidden_layers),
        "hidden": int(config.hidden_size),
    }


def in_subprocess(case: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, __file__, "--case", json.dumps(case)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if r.returncode != 0:
        raise SystemExit(f"case {case}: exit {r.returncode}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="/tmp/smol")
    p.add_argument("--lora", type=positive, default=8)
    p.add_argument("--sizes", type=positive, nargs=2, default=[1024, 4096])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.case:
        print(json.dumps(run_case(json.loads(a.case))))
        return
    rows, slopes = [], {}
    for checkpointing in (False, True):
        got = [
            in_subprocess(dict(model=a.model, lora=a.lora, checkpointing=checkpointing, tokens=n))
            for n in a.sizes
        ]
        rows += got
        slope = (got[1]["peak_bytes"] - got[0]["peak_bytes"]) / (a.sizes[1] - a.sizes[0])
        unit = slope / (got[0]["layers"] * got[0]["hidden"])
        slopes["checkpointing" if checkpointing else "plain"] = {
            "bytes_per_token": slope,
            "bytes_per_token_per_layer_x_hidden": unit,
        }
        print(
            f"gradient checkpointing {'on ' if checkpointing else 'off'}: "
            + ", ".join(f"{r['tokens']} tokens {r['peak_bytes'] / 2**20:.0f} MiB" for r in got)
            + f"; {slope / 2**10:.0f} KiB a token ({unit:.2f} B per token x layer x hidden)"
        )
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"cases": rows, "slopes": slopes}, indent=1) + "\n")


if __name__ == "__main__":
    main()

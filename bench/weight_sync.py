"""Seconds per weight sync to SGLang by disk, tensor and distributed, side by side in one run
(issue 29, item 3).

    python bench/weight_sync.py            # Qwen2.5-0.5B's shape, bfloat16 (~1 GB), ~5 min here
    python bench/weight_sync.py --quick    # a tiny shape, seconds

Each sync is one whole ``SGLangPolicy.update_weights`` (:mod:`policy.sglang.client`): pause,
load, ``/model_info`` confirming the version on the server, continue. ``weights=`` picks the
load: ``disk`` writes the checkpoint (``HFModel.save``) and the server reads it back;
``tensor`` posts the named tensors pickled with torch's multiprocessing reductions (shared
memory, not a copy of the bytes, for CPU tensors; CUDA IPC handles on a GPU); ``distributed``
forms an update group once, then broadcasts flattened buckets of ``--bucket-mb`` over it. The
methods take turns (``--repeats`` each, the order rotated each round) and the median
is reported, in wall seconds (a sync is waited on) and GB/s of the checkpoint's bytes.

**What serves them: the strict stand-in** (``tests/support/sglang_fake.py``, in this process on
its own threads), over real HTTP, a real torch.distributed group (gloo, over loopback) and real
safetensors on this disk. After every sync the bench checks that the stand-in holds the
learner's tensors of that version bit for bit. So the figures are the client's and the
transport's cost on a CPU, not a GPU server's: a real server also moves the weights onto its
GPU (and reads the disk path's files there), NCCL replaces gloo, and a GPU tensor's IPC handle
is a few hundred bytes. No SGLang runs on this machine or on the device machine lent here (no
network, and its wheels are larger than what a device call can carry), so the GPU figures are
not something this bench can give. Figures go to ``bench/results/weight_sync/``
(``weight_sync.json`` and ``weight_sync.png``).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import trio
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "weight_sync"
METHODS = ("disk", "tensor", "distributed")


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))  # the stand-in lives with the tests
    from collective.rl.make_model import make_tiny_lm
    from experiments.learner_cost import build_model
    from policy.sglang import SGLangPolicy
    from policy.sglang.weights import checkpoint_tensors
    from tests.support.sglang_fake import FakeSGLang

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny shape, one repeat")
    p.add_argument("--shape", default="", help="qwen2.5-0.5b (default) or tiny-152k (quick)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--repeats", type=int, default=0, help="syncs by each method (default 3)")
    p.add_argument("--bucket-mb", type=int, default=512, help="distributed: bytes a broadcast")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    shape = a.shape or ("tiny-152k" if a.quick else "qwen2.5-0.5b")
    repeats = a.repeats or (1 if a.quick else 3)
    torch.set_num_threads(1)
    rows: dict[str, list[float]] = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer = str(make_tiny_lm(work / "tiny-lm"))
        model = build_model(shape, tokenizer, "cpu", a.dtype, 0)
        served = model.save(work / "served")
        named = checkpoint_tensors(model)
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        print(f"{shape} in {a.dtype}: {len(named)} tensors, {nbytes / 1e9:.3f} GB", flush=True)
        server = FakeSGLang(served, deterministic=True).start()
        server.keep_held = False  # the stand-in's copy of each version: no real server's cost
        deadline = 60.0 if a.quick else 600.0  # a hung step fails in a minute when quick
        server.group_timeout = deadline
        policies = {
            m: SGLangPolicy(
                server.url,
                weights=m,  # type: ignore[arg-type]  # one of WEIGHTS_METHODS
                timeout=deadline,
                sync_timeout=deadline,
                bucket_bytes=a.bucket_mb << 20,
            )
            for m in METHODS
        }
        version = 0
        try:
            # rotated: each method first (and last) in turn
            rounds = [METHODS[k % 3 :] + METHODS[: k % 3] for k in range(repeats)]
            for method in tqdm([m for r in rounds for m in r], desc="syncs", unit="sync"):
                version += 1
                with torch.no_grad():  # new weights: every tensor differs from what is held
                    for _, t in named:
                        if t.is_floating_point():
                            t.add_(1.0)
                policy = policies[method]
                sync = functools.partial(
                    policy.update_weights,
                    functools.partial(model.save, work / f"v{version}"),
                    version,
                    tensors=lambda: checkpoint_tensors(model),
                )
                t0 = time.perf_counter()
                trio.run(sync)
                rows[method].append(time.perf_counter() - t0)
                if policy.last_sync_method != method:
                    raise SystemExit(f"{method}: the sync went by {policy.last_sync_method}")
                if server.weight_version != str(version) or not server.holds(named):
                    raise SystemExit(f"{method}: the stand-in does not hold version {version}")
                for old in work.glob("v*"):  # the disk path's checkpoints
                    shutil.rmtree(old)
        finally:
            server.stop()
    med = {m: statistics.median(v) for m, v in rows.items()}
    for m in METHODS:
        print(f"{m:>12}: {med[m]:7.3f} s a sync, {nbytes / 1e9 / med[m]:6.2f} GB/s", flush=True)
    result = {
        "shape": shape,
        "dtype": a.dtype,
        "bytes": nbytes,
        "tensors": len(named),
        "repeats": repeats,
        "bucket_bytes": a.bucket_mb << 20,
        "server": "tests/support/sglang_fake.py (CPU stand-in; gloo group over loopback)",
        "torch": torch.__version__,
        "seconds_per_sync": med,
        "runs": rows,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "weight_sync.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, a.out / "weight_sync.png")
    print(f"wrote {a.out / 'weight_sync.json'}")
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    from collective.base.outputs import save_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    med = result["seconds_per_sync"]
    ax.bar(list(med), list(med.values()), color=["#999", "#4a8", "#48c"])
    for m, runs in result["runs"].items():
        ax.plot([m] * len(runs), runs, "k.", alpha=0.6)
    ax.set_ylabel("wall seconds a sync")
    ax.set_title(
        f"{result['shape']} ({result['bytes'] / 1e9:.2f} GB) to the CPU stand-in", fontsize=10
    )
    fig.tight_layout()
    save_figure(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())

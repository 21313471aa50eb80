"""The LLM path on one GPU: the learner's tokens/s and peak memory, the hf policy's tokens/s.

One prepared command, nothing downloaded, sized for under 8 minutes on one H200::

    python bench/gpu.py             # CUDA: a Qwen2.5-0.5B-shaped model, random weights, bf16
    python bench/gpu.py --quick     # any machine (CPU here): a tiny shape, float32, ~1 minute
    python bench/gpu.py --model runs/models/smollm2-135m   # a real model directory instead

Two measurements, printed and saved as ``bench/results/gpu/{gpu,cpu-quick}.json`` (the README
beside them quotes the figures and says which machine made them):

1. **learner**: one RLCR learner step (``collective.rl.train.Learner.step``, the real one) on
   ``batch`` sequences of ``tokens`` tokens, the last ``outputs`` of each sampled under the
   action grammar: tokens/s (best of ``repeats`` steps after a warm-up) and peak memory, for
   {chunked, naive} logprobs x {full, LoRA}. *chunked* is ``policy.hf.model.HFModel``: hidden
   states,
   then logits only at output positions, ``logit_chunk`` at a time, recomputed in backward.
   *naive* is what the learner did before: logits of every position, ``[batch, tokens, vocab]``,
   in float32, then a masked log-softmax. Each case runs in a fresh process, so one case's
   peak cannot hide another's: CUDA, ``torch.cuda.max_memory_allocated`` above what the model
   and optimiser held before the step; CPU, the process's peak resident memory during the
   step (VmHWM, reset just before it) above its resident memory before it.
2. **policy**: output tokens/s of the in-process ``hf`` policy (``policy.hf.policy.HFPolicy``,
   batched, exact sums: :mod:`policy.hf.decoder`) at batch sizes 1 to 1,024 (``max_tokens``
   each, seeded), each beside ``transformers``' ``generate`` on the same prompts (no grammar,
   exactly ``max_tokens`` a row) and their ratio; first, the invariance check on this device
   (four requests alone, in a batch of 64 and in it reversed: the same bytes). Batches past a
   time budget are not run: the figure is projected from the largest measured batch, and the
   JSON says so. The learner's rows carry MFU on a known GPU (``PEAK_BF16``).

The model is built from a config (``Qwen2.5-0.5B``'s shape: hidden 896, 24 layers, 14 heads, 2
KV heads, MLP 4864, vocabulary 151,936, tied embeddings) with random weights, over the
``tiny-lm`` tokenizer (``collective make-model``), whose 2,000 tokens the grammar masks select
from 151,936 rows, as a real model's padded rows are masked. Speed does not depend on the
weights' values.

``--case JSON`` runs one learner case and prints its result; the cases themselves, each run in
a fresh process, are :mod:`experiments.learner_cost` (``tests/policy/test_hf_memory.py`` runs
them too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from experiments.learner_cost import SHAPES, build_model, case_in_subprocess, run_case

_HERE = Path(__file__).resolve().parent
OUT = _HERE / "results" / "gpu"

# -- the hf policy's throughput ------------------------------------------------------------------


def policy_sweep(
    shape: str,
    tokenizer: str,
    device: str,
    dtype: str,
    batches: list[int],
    max_tokens: int,
    budget: float,
) -> list[dict[str, Any]]:
    from collective import ActionSpace, ArgSpec, ToolSpec
    from collective.base.seeding import derive
    from policy.base import PolicyRequest
    from policy.hf.policy import HFPolicy

    model = build_model(shape, tokenizer, device, dtype, 0)
    policy = HFPolicy(model)
    space = ActionSpace(
        (
            ToolSpec("note", (ArgSpec("text", "text", max_chars=400),)),
            ToolSpec("add", (ArgSpec("amount", "int", lo=1, hi=3),)),
        )
    )

    def batch(n: int) -> list[PolicyRequest]:
        return [
            PolicyRequest(
                agent=i,
                turn=0,
                prompt=f"agent {i}: count {i} of 30",
                space=space,
                seed=derive(7, i),
                max_tokens=max_tokens,
            )
            for i in range(n)
        ]

    def generate(requests: list[PolicyRequest]) -> int:
        """``transformers``' ``generate`` on the same prompts: left-padded, sampling, no grammar,
        exactly ``max_tokens`` new tokens a row (the field's baseline); its output tokens."""
        from policy.hf.prompt import prompt_ids

        tok = model.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        ids = [prompt_ids(tok, r.prompt, r.space) for r in requests]
        width = max(len(i) for i in ids)
        x = torch.tensor([[pad] * (width - len(i)) + i for i in ids], device=model.device)
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device=x.device)
        with torch.inference_mode():
            out = model.causal.generate(
                input_ids=x,
                attention_mask=mask,
                do_sample=True,
                top_k=0,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                pad_token_id=pad,
            )
        return int(out.shape[1] - width) * len(requests)

    def timed(fn: Any) -> tuple[float, Any]:
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    policy.sample(batch(1))  # warm-up
    generate(batch(1))
    # The invariance check on this device: four requests alone, then at the front and back of
    # a batch of 64, reversed: the same token ids and logprobs, bit for bit.
    alone = [policy.sample([r])[0] for r in batch(4)]
    big = batch(64)
    together = policy.sample(big)
    backwards = policy.sample(big[::-1])[::-1]
    invariant = all(
        (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs) == (c.token_ids, c.logprobs)
        for a, b, c in zip(alone, together[:4], backwards[:4], strict=True)
    )
    print(f"  hf policy  invariance on {device}: {'holds' if invariant else 'BROKEN'}", flush=True)
    rows: list[dict[str, Any]] = [{"invariant_alone_batch_reversed": invariant}]
    per_request = 0.0
    for n in batches:
        projected = per_request * n
        if len(rows) > 1 and projected > budget:
            rows.append(
                {
                    "batch": n,
                    "measured": False,
                    "projected_seconds": projected,
                    "tokens_per_s": rows[-1]["tokens_per_s"],
                }
            )
            continue
        requests = batch(n)
        seconds, out = timed(lambda: policy.sample(requests))  # noqa: B023  (called at once)
        tokens = sum(len(a.token_ids) for a in out)
        per_request = seconds / n
        g_seconds, g_tokens = timed(lambda: generate(requests))  # noqa: B023
        rows.append(
            {
                "batch": n,
                "measured": True,
                "seconds": seconds,
                "tokens": tokens,
                "tokens_per_s": tokens / seconds,
                "generate_tokens_per_s": g_tokens / g_seconds,
                "batched_over_generate": (tokens / seconds) / (g_tokens / g_seconds),
            }
        )
        print(
            f"  hf policy  batch {n:5d}: {tokens / seconds:9.1f} tokens/s ({seconds:.2f} s); "
            f"generate {g_tokens / g_seconds:9.1f}; ratio {rows[-1]['batched_over_generate']:.2f}",
            flush=True,
        )
    return rows


#: Dense bfloat16 tensor-core peaks (FLOP/s, no sparsity), by a name in the device's: for MFU.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}


def mfu(row: dict[str, Any], machine: str) -> float | None:
    """Model FLOPs utilisation of a learner step: ``6 * parameters`` FLOPs a token (forward 2,
    backward 4; under LoRA the weight gradients are skipped, so this overstates what it had to
    do, and the figure is an upper bound) over the device's dense bf16 peak; None off a known
    GPU."""
    peak = next((v for k, v in PEAK_BF16.items() if k in machine), None)
    if peak is None or "tokens_per_s" not in row:
        return None
    return row["tokens_per_s"] * 6 * row["parameters"] / peak


# -- the whole bench -------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny shape on the CPU, float32")
    p.add_argument("--case", help="run one learner case (JSON) and print its result")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument(
        "--model",
        default="",
        help="a model directory (collective make-model smollm2-135m DIR) instead of random "
        "weights of a shape; its own tokenizer",
    )
    a = p.parse_args()
    if a.model and not (Path(a.model) / "config.json").is_file():
        p.error(f"--model {a.model}: not a model directory (no config.json)")
    if a.case:
        print(json.dumps(run_case(json.loads(a.case))))
        return
    cuda = torch.cuda.is_available() and not a.quick
    if not cuda and not a.quick:
        sys.exit("bench/gpu.py: no CUDA device here; run with --quick for the CPU check")
    device, dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    shape = a.model or ("qwen2.5-0.5b" if cuda else "tiny-152k")
    learner = (
        dict(batch=16, tokens=1024, outputs=128, repeats=3)
        if cuda
        else dict(batch=4, tokens=256, outputs=64, repeats=1)
    )
    batches = [1, 4, 16, 64, 256, 1024]
    t_start = time.perf_counter()
    result: dict[str, Any] = {
        "machine": torch.cuda.get_device_name()
        if cuda
        else f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "device": device,
        "dtype": dtype,
        "shape": {"name": shape, **SHAPES.get(shape, {})},
        "load_before": os.getloadavg(),
        "learner": [],
    }
    print(f"bench/gpu.py on {result['machine']}: {shape}, {dtype}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        from collective.rl.make_model import make_tiny_lm

        tokenizer = a.model or str(make_tiny_lm(Path(tmp) / "tiny-lm"))
        for mode in ("chunked", "naive"):
            for lora in (0, 16):
                case = dict(
                    shape=shape,
                    tokenizer=tokenizer,
                    device=device,
                    dtype=dtype,
                    mode=mode,
                    lora=lora,
                    logit_chunk=1024 if cuda else 256,
                    **learner,
                )
                row = case_in_subprocess(case)
                row["mfu"] = mfu(row, result["machine"]) if cuda else None
                result["learner"].append(row)
                if "error" in row:
                    print(f"  learner {mode:7s} lora={lora:2d}: FAILED {row['error']}", flush=True)
                else:
                    print(
                        f"  learner {mode:7s} lora={lora:2d}: {row['tokens_per_s']:10.1f} "
                        f"tokens/s, peak {row['peak_bytes'] / 2**30:6.2f} GiB"
                        + (f", MFU {row['mfu']:.1%}" if row["mfu"] is not None else ""),
                        flush=True,
                    )
        result["policy"] = policy_sweep(
            shape, tokenizer, device, dtype, batches, max_tokens=16, budget=60.0 if cuda else 20.0
        )
    result["load_after"] = os.getloadavg()
    result["wall_seconds"] = time.perf_counter() - t_start
    a.out.mkdir(parents=True, exist_ok=True)
    name = Path(a.model).name if a.model else ""
    path = a.out / ((f"{name}-" if name else "") + ("gpu.json" if cuda else "cpu-quick.json"))
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path} ({result['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()

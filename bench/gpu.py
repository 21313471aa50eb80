"""The LLM path on one GPU: the learner's tokens/s and peak memory, the hf policy's tokens/s.

One prepared command, nothing downloaded, sized for under 8 minutes on one H200::

    python bench/gpu.py             # CUDA: a Qwen2.5-0.5B-shaped model, random weights, bf16
    python bench/gpu.py --quick     # any machine (CPU here): a tiny shape, float32, ~1 minute

Two measurements, printed and saved as ``bench/results/gpu/{gpu,cpu-quick}.json`` (the README
beside them quotes the figures and says which machine made them):

1. **learner**: one RLCR learner step (``collective.rl.train.Learner.step``, the real one) on
   ``batch`` sequences of ``tokens`` tokens, the last ``outputs`` of each sampled under the
   action grammar: tokens/s (best of ``repeats`` steps after a warm-up) and peak memory, for
   {chunked, naive} logprobs x {full, LoRA}. *chunked* is ``policy.hf.sample.HFModel``: hidden
   states,
   then logits only at output positions, ``logit_chunk`` at a time, recomputed in backward.
   *naive* is what the learner did before: logits of every position, ``[batch, tokens, vocab]``,
   in float32, then a masked log-softmax. Each case runs in a fresh process, so one case's
   peak cannot hide another's: CUDA, ``torch.cuda.max_memory_allocated`` above what the model
   and optimiser held before the step; CPU, the process's peak resident memory during the
   step (VmHWM, reset just before it) above its resident memory before it.
2. **policy**: output tokens/s of the in-process ``hf`` policy (``policy.hf.policy.HFPolicy``)
   at batch sizes 1 to 1,024 (``max_tokens`` each, seeded). Batches past a time budget are not
   run: the figure is projected from the largest measured batch, and the JSON says so.

The model is built from a config (``Qwen2.5-0.5B``'s shape: hidden 896, 24 layers, 14 heads, 2
KV heads, MLP 4864, vocabulary 151,936, tied embeddings) with random weights, over the
``tiny-lm`` tokenizer (``collective make-model``), whose 2,000 tokens the grammar masks select
from 151,936 rows, as a real model's padded rows are masked. Speed does not depend on the
weights' values.

``--case JSON`` runs one learner case and prints its result (what the parent runs in a
subprocess); ``tests/policy/test_hf_memory.py`` uses it too.
"""

from __future__ import annotations

# The path fix below must run before the project's imports:
# ruff: noqa: E402
import sys
from pathlib import Path

# Run as a script, this file's folder heads sys.path and would hide nothing today, but the
# repository root must be importable however the script is started.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse
import json
import os
import platform
import resource
import subprocess
import tempfile
import time
from typing import Any

import torch

OUT = _HERE / "results" / "gpu"

#: Qwen2.5-0.5B's shape (its config.json), and the tiny one of --quick.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1e6,
    ),
    "tiny-152k": dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=151936,
        max_position_embeddings=4096,
        rope_theta=1e4,
    ),
}


# -- building what a case needs --------------------------------------------------------------


def build_model(shape: str, tokenizer_dir: str, device: str, dtype: str, lora: int, **kw: Any):
    """An HFModel of ``shape`` with random weights over the tiny-lm tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from policy.hf.prompt import load_tokenizer
    from policy.hf.sample import DTYPES, HFModel

    tokenizer = load_tokenizer(tokenizer_dir)
    config = Qwen2Config(
        **SHAPES[shape],
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attention_dropout=0.0,
    )
    torch.manual_seed(0)
    with torch.device(device):
        module = Qwen2ForCausalLM(config).to(DTYPES[dtype]).eval()
    if lora:
        from peft import LoraConfig, get_peft_model

        module = get_peft_model(
            module, LoraConfig(r=lora, lora_alpha=2 * lora, target_modules="all-linear")
        ).eval()
    return HFModel(module, tokenizer, **kw)


def samples_for(model: Any, batch: int, tokens: int, outputs: int) -> list[Any]:
    """``batch`` samples of about ``tokens`` tokens: a prompt, then ``outputs`` tokens of one
    ``note "..."`` action (and the stop token) that the grammar accepts."""
    from collective import ActionSpace, ArgSpec, ToolSpec
    from collective.rl.train import Sample
    from policy.hf.prompt import prompt_ids

    space = ActionSpace((ToolSpec("note", (ArgSpec("text", "text", max_chars=8 * outputs),)),))
    tok = model.tokenizer
    words = ["count", "target", "more", "done", "stop", "add", "wait", "read", "post", "msg"]
    head = tok.encode('note "', add_special_tokens=False)
    body: list[int] = []
    k = 0
    while len(head) + len(body) + 2 < outputs:
        body += tok.encode(words[k % len(words)] + " ", add_special_tokens=False)
        k += 1
    out = [*head, *body][: outputs - 2] + tok.encode('"', add_special_tokens=False)
    out = [*out, tok.eos_token_id][:outputs]
    prompt = ""
    while len(prompt_ids(tok, prompt, space)) < tokens - len(out):
        prompt += " ".join(words) + "\n"
    return [
        Sample(prompt, out, space, [0.0] * len(out), 1.0 - 2 * (i % 2), 1.0, 0)
        for i in range(batch)
    ]


class NaiveHFModel:
    """The learner's logprobs as they were: logits of every position in float32, then a
    masked log-softmax of the output positions. For the comparison only."""

    @staticmethod
    def install(model: Any) -> None:
        from policy.hf.grammar import masked_logits

        def score(prompts, outputs, masks, temperature, entropy_grad=False):
            device = model.device
            seqs = [p + o[:-1] for p, o in zip(prompts, outputs, strict=True)]
            width = max(len(s) for s in seqs)
            ids = torch.zeros((len(seqs), width), dtype=torch.long)
            att = torch.zeros((len(seqs), width), dtype=torch.long)
            for i, s in enumerate(seqs):
                ids[i, : len(s)] = torch.tensor(s)
                att[i, : len(s)] = 1
            logits = model.model(input_ids=ids.to(device), attention_mask=att.to(device)).logits
            logits = logits.float()  # [batch, tokens, vocab], float32: the naive figure
            lps, ents = [], []
            for i, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
                z = masked_logits(
                    logits[i, len(p) - 1 : len(p) - 1 + len(o)], temperature, masks[i]
                )
                logp = torch.log_softmax(z, -1)
                lps.append(logp.gather(-1, torch.tensor(o, device=device)[:, None])[:, 0])
                ents.append(-(logp.exp() * z).sum(-1) + torch.logsumexp(z, -1))
            return lps, ents

        model._score = score


# -- one learner case, in its own process ------------------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    """Start the process's peak resident memory (VmHWM) afresh (Linux >= 4.0); False where
    that cannot be done, and the peak then is the whole life's (an upper bound)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """One learner step (after a warm-up on a small batch), timed and measured."""
    from collective.rl.train import Learner, TrainConfig

    device, dtype = case["device"], case["dtype"]
    torch.set_num_threads(case.get("threads", 1))
    model = build_model(
        case["shape"],
        case["tokenizer"],
        device,
        dtype,
        case["lora"],
        batch_size=case["batch"],
        logit_chunk=case["logit_chunk"],
    )
    if case["mode"] == "naive":
        NaiveHFModel.install(model)
    cfg = TrainConfig(learning_rate=1e-5, clip=0.2, chunk=case["batch"], temperature=1.0)
    learner = Learner(model, cfg)
    samples = samples_for(model, case["batch"], case["tokens"], case["outputs"])
    learner.step(samples[:1])  # warm-up: kernels, optimiser state, allocator
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss()
        fresh_peak = _reset_peak_rss()
    best = float("inf")
    for _ in range(case["repeats"]):
        t0 = time.perf_counter()
        learner.step(samples)
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() if cuda else _peak_rss()) - base
    tokens = case["batch"] * case["tokens"]
    return {
        **{k: case[k] for k in ("mode", "lora", "batch", "tokens", "outputs", "logit_chunk")},
        "tokens_per_s": tokens / best,
        "step_seconds": best,
        "peak_bytes": max(peak, 0),
        "naive_logits_bytes": tokens * model.vocab_size * 4,  # [batch, tokens, vocab] float32
        "trainable_parameters": sum(p.numel() for p in model.parameters()),
        "peak_of": "the step" if cuda or fresh_peak else "the process (an upper bound)",
    }


def case_in_subprocess(case: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """``run_case`` in a fresh process. glibc keeps freed blocks below its (rising) mmap
    threshold for reuse, so resident memory would count tensors long dead; with a fixed 64 KiB
    threshold every larger block is mapped and unmapped with its tensor, and the peak resident
    memory is the peak of live memory (plus the small blocks)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    r = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--case", json.dumps(case)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-5:])
        return {**case, "error": f"exit {r.returncode}: {tail}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


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

    policy.sample(batch(1))  # warm-up
    rows: list[dict[str, Any]] = []
    per_request = 0.0
    for n in batches:
        projected = per_request * n
        if rows and projected > budget:
            rows.append(
                {
                    "batch": n,
                    "measured": False,
                    "projected_seconds": projected,
                    "tokens_per_s": rows[-1]["tokens_per_s"],
                }
            )
            continue
        t0 = time.perf_counter()
        out = policy.sample(batch(n))
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        tokens = sum(len(a.token_ids) for a in out)
        per_request = seconds / n
        rows.append(
            {
                "batch": n,
                "measured": True,
                "seconds": seconds,
                "tokens": tokens,
                "tokens_per_s": tokens / seconds,
            }
        )
        print(
            f"  hf policy  batch {n:5d}: {tokens / seconds:9.1f} tokens/s ({seconds:.2f} s)",
            flush=True,
        )
    return rows


# -- the whole bench -------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny shape on the CPU, float32")
    p.add_argument("--case", help="run one learner case (JSON) and print its result")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()
    if a.case:
        print(json.dumps(run_case(json.loads(a.case))))
        return
    cuda = torch.cuda.is_available() and not a.quick
    if not cuda and not a.quick:
        sys.exit("bench/gpu.py: no CUDA device here; run with --quick for the CPU check")
    device, dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    shape = "qwen2.5-0.5b" if cuda else "tiny-152k"
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
        "shape": {"name": shape, **SHAPES[shape]},
        "load_before": os.getloadavg(),
        "learner": [],
    }
    print(f"bench/gpu.py on {result['machine']}: {shape}, {dtype}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        from collective.rl.make_model import make_tiny_lm

        tokenizer = str(make_tiny_lm(Path(tmp) / "tiny-lm"))
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
                result["learner"].append(row)
                if "error" in row:
                    print(f"  learner {mode:7s} lora={lora:2d}: FAILED {row['error']}", flush=True)
                else:
                    print(
                        f"  learner {mode:7s} lora={lora:2d}: {row['tokens_per_s']:10.1f} "
                        f"tokens/s, peak {row['peak_bytes'] / 2**30:6.2f} GiB",
                        flush=True,
                    )
        result["policy"] = policy_sweep(
            shape, tokenizer, device, dtype, batches, max_tokens=16, budget=60.0 if cuda else 20.0
        )
    result["load_after"] = os.getloadavg()
    result["wall_seconds"] = time.perf_counter() - t_start
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / ("gpu.json" if cuda else "cpu-quick.json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path} ({result['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()

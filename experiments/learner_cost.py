"""One RLCR learner step on the Hugging Face path, timed and its peak memory measured, each
case in a fresh process: what ``bench/gpu.py`` measures ({chunked, naive} logprobs x {full,
LoRA}: its docstring) and ``tests/policy/test_hf_memory.py`` asserts.

A case is a dict (``shape``, ``tokenizer``, ``device``, ``dtype``, ``mode``, ``lora``,
``batch``, ``tokens``, ``outputs``, ``logit_chunk``, ``repeats``); :func:`case_in_subprocess`
runs ``python -m experiments.learner_cost --case JSON``, which prints
:func:`run_case`'s row. Needs the ``hf`` extra (transformers, and peft for LoRA).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import torch

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
    """An HFModel of ``shape`` with random weights over the tiny-lm tokenizer; or, where
    ``shape`` is not a name of ``SHAPES``, the model directory it names, weights and all (a
    real model: SmolLM2-135M-Instruct from ``collective make-model smollm2-135m``)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from policy.hf.model import DTYPES, HFModel
    from policy.hf.prompt import load_tokenizer

    if shape not in SHAPES:
        return HFModel.load(shape, device=device, dtype=dtype, lora_rank=lora, **kw)

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
        module = Qwen2ForCausalLM(config).to(DTYPES[dtype]).eval()  # type: ignore[arg-type]  # transformers wraps .to
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

        def score(prompts, outputs, masks, temperature, entropy_grad=False, top_p=1.0):
            if top_p != 1.0:
                raise ValueError("the naive learner measures the full distribution: top_p = 1")
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
        "parameters": sum(p.numel() for p in model.model.parameters()),
        "peak_of": "the step" if cuda or fresh_peak else "the process (an upper bound)",
    }


def case_in_subprocess(case: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """``run_case`` in a fresh process. glibc keeps freed blocks below its (rising) mmap
    threshold for reuse, so resident memory would count tensors long dead; with a fixed 64 KiB
    threshold every larger block is mapped and unmapped with its tensor, and the peak resident
    memory is the peak of live memory (plus the small blocks)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    r = subprocess.run(
        [sys.executable, "-m", "experiments.learner_cost", "--case", json.dumps(case)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-5:])
        return {**case, "error": f"exit {r.returncode}: {tail}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", required=True, help="one learner case (JSON): print its result")
    print(json.dumps(run_case(json.loads(p.parse_args().case))))


if __name__ == "__main__":
    main()

"""Run in a subprocess by ``tests/policy/test_tiny_policy.py`` (``--model tiny``, the tiny model's
sampler) and ``tests/policy/test_hf_batched.py`` (``--model hf``: the in-process Hugging Face
policy over a small Qwen2-architecture model with projection biases, grouped-query attention
and a feed-forward width that needs padding), under settings that steer which
kernels torch, MKL and oneDNN pick (environment variables capping the instruction set or setting
MKL's compatibility mode; ``--threads`` for the process's torch threads, ``--no-mkldnn``): samples
one set of requests in batches of every size from 1 to ``--positions`` with a request at every
position, and in batches whose sizes cross the points where BLAS libraries change strategy, and
prints one JSON line saying which answers differed, bit for bit, from the same request's answer in
the largest batch, and a digest of those answers.

As a control it also says at which of those batch sizes a plain float32 matrix product gives a
row other bits under the same settings: where it does, the sampler's invariance is not the
kernels' doing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import collective  # noqa: F401  (the engine before policy: policy.base imports it)
from collective import ActionSpace, ArgSpec, ToolSpec
from collective.base.seeding import derive
from policy.base import PolicyRequest
from policy.tiny import TinyConfig, TinyModel

#: Around the row counts where GEMM libraries switch kernels or blocking.
SIZES = (1, 2, 3, 4, 7, 8, 9, 16, 17, 64, 65, 257)
#: Three query heads, a feed-forward width that is no multiple of anything: odd shapes.
CONFIG = TinyConfig(d_model=48, n_heads=3, d_ff=72, n_layers=2, context=96, seed=5)
SPACE = ActionSpace(
    (
        ToolSpec("add", (ArgSpec("amount", "int", lo=1, hi=9),)),
        ToolSpec("say", (ArgSpec("text", "text", max_chars=12, words=("go", "wait")),)),
    )
)


def request(i: int) -> PolicyRequest:
    prompt = f"agent {i % 7}: count {i * 13 % 50}\n" + "inbox: [2] go\n" * (i % 4) + "last: ok\n>"
    return PolicyRequest(
        agent=i,
        turn=0,
        prompt="w" * (i * 7 % 40) + prompt,
        space=SPACE,
        seed=derive(3, i),
        max_tokens=(6, 10, 16)[i % 3],
        temperature=(0.7, 1.0, 1.6)[i % 3],
    )


def hf_sampler() -> object:
    """A small Qwen2 (biases, 6 query heads over 2 key/value heads, feed-forward 72 wide, tied
    head) with rank-4 LoRA adapters on every linear layer, made non-zero (so the decoder's
    adapter products, beside its base matrices, are under test too), over the tests'
    tokenizer, in the in-process policy with one sampling thread."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from policy.hf.model import HFModel
    from policy.hf.policy import HFPolicy
    from tests.support.hf_tiny import make_tokenizer

    tokenizer = make_tokenizer()
    torch.manual_seed(5)
    config = Qwen2Config(
        vocab_size=len(tokenizer) + 64,
        hidden_size=48,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    lora = LoraConfig(r=4, lora_alpha=12.0, lora_dropout=0.0, target_modules="all-linear")
    module = get_peft_model(Qwen2ForCausalLM(config), lora).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # peft starts B at zero
    return HFPolicy(HFModel(module, tokenizer), workers=1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1, help="the process's torch threads")
    p.add_argument("--no-mkldnn", action="store_true")
    p.add_argument("--positions", type=int, default=8)
    p.add_argument("--model", choices=("tiny", "hf"), default="tiny")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.backends.mkldnn.enabled = not a.no_mkldnn
    # the tiny model: a batch is one forward
    tiny = a.model == "tiny"
    model = TinyModel.fresh(CONFIG, max_rows=1024, workers=1) if tiny else hf_sampler()
    largest = [request(i) for i in range(max(SIZES))]
    want = [(r.token_ids, r.logprobs) for r in model.sample(largest)]
    differ = []
    for n in SIZES:
        got = model.sample(largest[:n])
        differ += [
            f"request {i} in a batch of {n}"
            for i, r in enumerate(got)
            if want[i] != (r.token_ids, r.logprobs)
        ]
    backwards = model.sample(largest[:65][::-1])[::-1]
    differ += [
        f"request {i} in a reversed batch"
        for i, r in enumerate(backwards)
        if want[i] != (r.token_ids, r.logprobs)
    ]
    # Requests of each budget and temperature, at every position of every batch size up to
    # --positions, among neighbours that change with the position.
    for target in (0, 1, 2):
        others = [r for i, r in enumerate(largest) if i != target]
        for n in range(1, a.positions + 1):
            for at in range(n):
                batch = others[at * 5 : at * 5 + n - 1]
                got = model.sample([*batch[:at], largest[target], *batch[at:]])[at]
                if want[target] != (got.token_ids, got.logprobs):
                    differ.append(f"request {target} at {at} in a batch of {n}")
    # The control: the rows a plain float32 product gives each batch size, against 4 rows.
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(max(SIZES), 64, generator=g), torch.randn(96, 64, generator=g)
    ref = torch.nn.functional.linear(x[:4], w)
    blas = [
        n
        for n in SIZES
        if not torch.equal(torch.nn.functional.linear(x[:n], w)[: min(n, 4)], ref[: min(n, 4)])
    ]
    print(
        json.dumps(
            {
                "capability": torch.backends.cpu.get_cpu_capability(),
                "differ": differ[:10],
                "answers": hashlib.sha256(repr(want).encode()).hexdigest(),
                "blas_batch_sizes_that_differ": blas,
            }
        )
    )


if __name__ == "__main__":
    main()

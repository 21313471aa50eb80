"""The learner's logprobs never hold ``[batch, tokens, vocab]`` logits: measured, not assumed.

One learner step (the real ``Learner.step``: forward, masked logprobs, loss, backward, AdamW)
runs in a fresh process on a model with Qwen's 151,936-row vocabulary and a tiny width, and the
process's peak resident memory above what it held before the step is read back
(:mod:`experiments.learner_cost`, the same code the GPU benchmark runs). The naive way
(every position's logits in float32) is measured too, on one sequence, to show the measurement
sees such tensors.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.learner_cost import case_in_subprocess
from tests.support.busy import scaled
from tests.support.hf_tiny import tiny_lm  # noqa: F401  (a fixture)

GIB = 2**30


def case(tokenizer: Path, **kw) -> dict:
    base = dict(
        shape="tiny-152k",
        tokenizer=str(tokenizer),
        device="cpu",
        dtype="float32",
        lora=0,
        logit_chunk=64,
        repeats=1,
        outputs=64,
        tokens=1024,
    )
    row = case_in_subprocess({**base, **kw}, timeout=scaled(280))
    assert "error" not in row, row.get("error")
    return row


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_a_learner_step_on_16_by_1024_tokens_stays_far_below_the_naive_logits(tiny_lm):  # noqa: F811
    naive = case(tiny_lm, mode="naive", batch=1)
    # the measurement sees a [1, 1024, 151936] float32 tensor (0.58 GiB) when one exists
    assert naive["peak_bytes"] >= 0.9 * naive["naive_logits_bytes"], naive
    chunked = case(tiny_lm, mode="chunked", batch=16)
    logits = chunked["naive_logits_bytes"]  # [16, 1024, 151936] float32: 9.3 GiB
    print(
        f"16 x 1024 tokens, vocabulary 151,936: peak {chunked['peak_bytes'] / GIB:.2f} GiB "
        f"(naive logits alone {logits / GIB:.1f} GiB; one naive sequence measured "
        f"{naive['peak_bytes'] / GIB:.2f} GiB)"
    )
    assert logits > 9 * GIB
    assert chunked["peak_bytes"] < logits / 20


def test_the_guard_counts_an_hf_runs_model_as_loaded(tiny_lm, monkeypatch):  # noqa: F811
    """The model's parameters and LoRA's adapters, read from the directory without loading it,
    are what the loaded model has. Under LoRA the served versions (lag + 1) share the base
    tensors and one set of the decoder's float64 base matrices, and each adds its adapters
    (float32 in its copy, float64 in its decoder); without LoRA each is a copy of the model
    with matrices of its own. Both as the decoders built hold them; a machine that cannot hold
    them refuses the run in one line."""
    from collective.engine import limits
    from collective.rl.checks import check_training, model_parts
    from collective.rl.config import read_config
    from policy.hf.decoder import FixedDecoder
    from policy.hf.model import HFModel
    from policy.hf.policy import HFPolicy

    cfg = read_config(
        dict(backend="hf", hf_model=str(tiny_lm), device="cpu", lora_rank=4, chunk_tokens=512)
    )
    parts = model_parts(cfg)
    loaded = HFModel.load(tiny_lm, lora_rank=4)
    every = sum(p.numel() for p in loaded.model.parameters())
    trained = sum(p.numel() for p in loaded.parameters())
    params = every - trained
    assert parts[f"the model ({params:,} parameters)"] == (params + trained) * 4
    assert parts[f"gradients and Adam moments of {trained:,}"] == trained * 3 * 4
    decoders = [HFPolicy(loaded.copy(version=v)).decoder() for v in (1, 2)]
    assert all(isinstance(d, FixedDecoder) for d in decoders)
    table = decoders[0].cos.numel() * 8 * 2  # (the rotary table: not counted, a few MB at most)
    base = parts["the decoder's base matrices (float64, shared by every version)"]
    held = decoders[0].base.nbytes() - table
    # (the guard counts norm gains the decoder folds away, and not the SiLU padding: 0.1% apart)
    assert abs(base - held) < 0.002 * held, (base, held)
    assert decoders[1].base is decoders[0].base
    (served,) = [
        v for k, v in parts.items() if k.startswith("2 served versions at") and "adapters" in k
    ]
    held = sum(trained * 4 + d.adapter_nbytes() for d in decoders)
    assert abs(served - held) < 0.01 * held, (served, held)
    # (a LoRA checkpoint is saved merged: a whole copy of the model while it is written)
    assert parts["a merged copy while a checkpoint is written"] == (params + trained) * 4

    plain = model_parts(read_config(dict(backend="hf", hf_model=str(tiny_lm), device="cpu")))
    (served,) = [v for k, v in plain.items() if k.startswith("2 served versions at")]
    whole = HFModel.load(tiny_lm)
    decoder = FixedDecoder(whole.causal, whole.cache_arg)
    held = 2 * (sum(p.numel() for p in whole.model.parameters()) * 4 + decoder.nbytes() - table)
    assert abs(served - held) < 0.002 * held, (served, held)
    assert parts["the backward at 512 tokens"] > 0
    said = check_training(cfg)
    assert "served versions" in said and "the backward at 512 tokens" in said
    need = sum(parts.values())
    monkeypatch.setattr(limits, "available_memory", lambda: need // 2)
    with pytest.raises(ValueError, match=r"^training: .* served versions .* more than the ") as e:
        check_training(cfg)
    assert "\n" not in str(e.value)
    assert model_parts(read_config(dict(backend="hf", hf_model=str(tiny_lm), device="cuda"))) == {}


def test_a_safetensors_header_length_past_the_formats_limit_is_refused_unread(tmp_path: Path):
    """A damaged length field would make the guard allocate that many bytes: it is refused in
    one line naming the file, before anything is read."""
    import json
    import struct

    from policy.hf.size import MAX_HEADER, model_size

    (tmp_path / "config.json").write_text(
        json.dumps({"hidden_size": 4, "vocab_size": 8, "num_hidden_layers": 1})
    )
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", MAX_HEADER + 1) + b"{}")
    with pytest.raises(ValueError, match=r"model\.safetensors: a header of 100,000,001 bytes"):
        model_size(tmp_path)

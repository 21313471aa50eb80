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

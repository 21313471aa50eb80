"""The Hugging Face learner path on a CPU, with a tiny model and tokenizer built here.

A two-layer Llama with random weights stands in for the model SGLang would serve (no downloads):
sample from it with ``transformers``' own ``generate``, recompute the logprobs with
:class:`HFModel`, take one policy-gradient step with a positive (then a negative) advantage, save
in SGLang's load layout, reload from disk, and check the sampled tokens became more (less) likely.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from hf_tiny import make_model, make_tokenizer

from collective.actions import ActionSpace, ArgSpec, ToolSpec
from collective.train import Learner, Sample, TrainConfig
from policy.base import TrainableModel
from policy.hf import HFModel
from policy.hf_prompt import prompt_ids

SPACE = ActionSpace(
    (
        ToolSpec("add", (ArgSpec("amount", "int", lo=1, hi=3),)),
        ToolSpec("wait", (ArgSpec("seconds", "int", lo=0, hi=600),), "wait"),
    )
)
PROMPTS = ["agent 0: count 0 of 30", "agent 1: count 4 of 30", "agent 2: count 9 of 30"]


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def sample(model: HFModel, n_tokens: int = 6) -> list[list[int]]:
    """Sampled outputs, each its own length (one prompt at a time: no padding in generate)."""
    torch.manual_seed(1)
    outs = []
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([prompt_ids(model.tokenizer, p, SPACE)])
        with torch.no_grad():
            full = model.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=n_tokens - i,
                min_new_tokens=n_tokens - i,
                pad_token_id=model.tokenizer.pad_token_id,
            )
        outs.append(full[0, ids.shape[1] :].tolist())
    return outs


def total_logprobs(model: HFModel, outputs: list[list[int]]) -> list[float]:
    with torch.no_grad():
        lps, _ = model.token_logprobs(PROMPTS, outputs, [SPACE] * len(PROMPTS))
    return [float(lp.sum()) for lp in lps]


def test_it_is_a_trainable_model(tokenizer):
    assert isinstance(HFModel(make_model(tokenizer), tokenizer), TrainableModel)


def test_logprobs_match_a_plain_forward_pass_whatever_the_batch(tokenizer):
    model = HFModel(make_model(tokenizer), tokenizer, batch_size=2)  # 3 samples: 2 batches
    outputs = sample(model)
    lps, ents = model.token_logprobs(PROMPTS, outputs, [SPACE] * 3, temperature=0.7)
    for p, out, lp, ent in zip(PROMPTS, outputs, lps, ents, strict=True):
        prompt = prompt_ids(tokenizer, p, SPACE)
        with torch.no_grad():  # one unpadded sequence, scored by hand
            logits = model.model(torch.tensor([prompt + out])).logits[0].float() / 0.7
        want = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(
            -1, torch.tensor(out)[:, None]
        )[:, 0]
        assert lp.shape == (len(out),) and lp.requires_grad
        torch.testing.assert_close(lp.detach(), want, atol=1e-5, rtol=1e-5)
        assert ((ent >= 0) & (ent <= math.log(len(tokenizer)) + 1e-4)).all()
    alone, _ = model.token_logprobs(PROMPTS[1:2], outputs[1:2], [SPACE], temperature=0.7)
    torch.testing.assert_close(alone[0], lps[1], atol=1e-5, rtol=1e-5)  # padding changes nothing
    with pytest.raises(ValueError, match="temperature must be > 0"):
        model.token_logprobs(PROMPTS, outputs, [SPACE] * 3, temperature=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.token_logprobs(PROMPTS[:1], [[len(tokenizer) + 5]], [SPACE])
    with pytest.raises(ValueError, match="must match"):
        model.token_logprobs(PROMPTS, outputs[:2], [SPACE] * 3)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_a_step_moves_the_sampled_tokens_the_advantages_way_and_survives_a_reload(
    tokenizer, tmp_path, advantage
):
    model = HFModel(make_model(tokenizer), tokenizer, version=4)
    outputs = sample(model)
    before = total_logprobs(model, outputs)

    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    lps, _ = model.token_logprobs(PROMPTS, outputs, [SPACE] * 3)
    loss = -sum(advantage * lp.sum() for lp in lps) / sum(len(o) for o in outputs)
    opt.zero_grad()
    loss.backward()
    opt.step()
    model.version += 1  # what the learner does after every step
    trained = total_logprobs(model, outputs)

    path = model.save(tmp_path / "step-1")
    assert path == tmp_path / "step-1" and model.version == 5
    # the layout SGLang's /update_weights_from_disk and --model-path read
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    assert (path / "tokenizer.json").is_file()
    assert json.loads((path / "collective.json").read_text()) == {"version": 5}

    reloaded = HFModel.load(path)
    assert reloaded.version == 5
    after = total_logprobs(reloaded, outputs)
    assert after == pytest.approx(trained, abs=1e-4)  # the weights on disk are the trained ones
    for b, a in zip(before, after, strict=True):
        assert (a - b) * advantage > 0.05, (before, after)


def test_the_learner_pushes_a_bad_rollout_down_though_the_server_masked_its_tokens(tokenizer):
    """SGLang reports logprobs under its grammar mask (a forced token: logprob 0), which this
    model's unmasked softmax cannot reproduce. A ratio against those would be far below
    1 - clip, and the clipped loss would give a negative advantage no gradient; the learner
    takes the ratio against the model's own logprobs instead, so the tokens still go down."""
    model = HFModel(make_model(tokenizer), tokenizer)
    outputs = sample(model)
    before = total_logprobs(model, outputs)
    masked = [[0.0] * len(o) for o in outputs]  # what a server with a tight grammar reports
    samples = [
        Sample(p, o, SPACE, lp, -1.0, 1.0, 0)
        for p, o, lp in zip(PROMPTS, outputs, masked, strict=True)
    ]
    Learner(model, TrainConfig(learning_rate=3e-3)).step(samples)
    after = total_logprobs(model, outputs)
    assert all(a < b - 0.05 for a, b in zip(after, before, strict=True)), (before, after)


def test_load_refuses_a_directory_without_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        HFModel.load(tmp_path)

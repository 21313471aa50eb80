"""The Hugging Face learner (policy.hf.model) on a CPU, with tiny models built here (no downloads).

What it must get right: the logprob of every sampled token under exactly the distribution that
sampled it (grammar mask, temperature), chunked so no [batch, tokens, vocab] logits exist; one
policy-gradient step moving tokens the advantage's way; weights that survive save and reload;
LoRA training only adapters, with the base model (adapters off) as the KL reference; and the
bad inputs refused in one line before anything trains.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from collective import ActionSpace, ArgSpec, ToolSpec
from collective.rl.config import read_config
from collective.rl.train import Learner, Sample
from policy.base import PolicyRequest, TrainableModel
from policy.hf.grammar import GrammarError, unpack
from policy.hf.model import HFModel, check_model_dir, placement
from policy.hf.policy import HFPolicy
from policy.hf.prompt import prompt_ids
from tests.support.hf_tiny import make_model, make_tokenizer

SPACE = ActionSpace(
    (
        ToolSpec("add", (ArgSpec("amount", "int", lo=1, hi=3),)),
        ToolSpec("note", (ArgSpec("text", "text", max_chars=12),)),
        ToolSpec("wait", (ArgSpec("seconds", "int", lo=0, hi=600),), "wait"),
    )
)
PROMPTS = ["agent 0: count 0 of 30", "agent 1: count 4 of 30", "agent 2: count 9 of 30"]


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def hf(tokenizer, **kw) -> HFModel:
    """A tiny Llama whose output layer has 64 rows more than the tokenizer (as Qwen pads)."""
    return HFModel(make_model(tokenizer, vocab_size=len(tokenizer) + 64), tokenizer, **kw)


def sampled(model: HFModel, temperature: float = 1.0, max_tokens: int = 12) -> list[list[int]]:
    policy = HFPolicy(model, workers=1)
    reqs = [
        PolicyRequest(
            agent=i,
            turn=0,
            prompt=p,
            space=SPACE,
            seed=100 + i,
            max_tokens=max_tokens,
            temperature=temperature,
        )
        for i, p in enumerate(PROMPTS)
    ]
    return [r.token_ids for r in policy.sample(reqs)]


def by_hand(model: HFModel, prompt: str, out: list[int], temperature: float) -> torch.Tensor:
    """The masked, tempered log-softmax of one unpadded sequence, with full logits."""
    ids = prompt_ids(model.tokenizer, prompt, SPACE)
    with torch.no_grad():
        logits = model.model(torch.tensor([ids + out])).logits[0].float() / temperature
    at = logits[len(ids) - 1 : -1]
    allowed = unpack(model.grammar.masks(SPACE, out, "by hand"), at.shape[-1])
    at = at.masked_fill(~allowed, -math.inf)
    return torch.log_softmax(at, -1).gather(-1, torch.tensor(out)[:, None])[:, 0]


def total(model: HFModel, outputs: list[list[int]]) -> list[float]:
    with torch.no_grad():
        lps, _ = model.token_logprobs(PROMPTS, outputs, [SPACE] * len(PROMPTS))
    return [float(lp.sum()) for lp in lps]


def test_it_is_a_trainable_model(tokenizer):
    assert isinstance(hf(tokenizer), TrainableModel)


@pytest.mark.parametrize(("batch_size", "logit_chunk"), [(1, 1), (2, 3), (8, 256)])
def test_logprobs_are_the_masked_tempered_distribution_however_chunked(
    tokenizer, batch_size, logit_chunk
):
    model = hf(tokenizer, batch_size=batch_size, logit_chunk=logit_chunk)
    outputs = sampled(model, temperature=0.7)
    lps, ents = model.token_logprobs(PROMPTS, outputs, [SPACE] * 3, temperature=0.7)
    for p, out, lp, ent in zip(PROMPTS, outputs, lps, ents, strict=True):
        assert lp.shape == (len(out),) and lp.requires_grad
        torch.testing.assert_close(lp.detach(), by_hand(model, p, out, 0.7), atol=1e-5, rtol=0)
        assert ((ent >= -1e-6) & (ent <= math.log(len(tokenizer)) + 1e-4)).all()
    # a forced token (the closing quote, the stop token after "add 3") has logprob 0, entropy 0
    assert any(float(lp.detach().max()) > -1e-6 for lp in lps)
    alone, _ = model.token_logprobs(PROMPTS[1:2], outputs[1:2], [SPACE], temperature=0.7)
    torch.testing.assert_close(alone[0], lps[1], atol=1e-5, rtol=0)  # padding changes nothing


def test_outputs_the_grammar_or_vocabulary_refuse_are_named(tokenizer):
    model = hf(tokenizer)
    bad = tokenizer.encode("mark red", add_special_tokens=False)  # no such tool here
    with pytest.raises(GrammarError, match=r"output 1: token 0 .* not allowed by the action"):
        model.token_logprobs(PROMPTS[:2], [[], bad], [SPACE] * 2)
    add = [*tokenizer.encode("add 3", add_special_tokens=False), tokenizer.eos_token_id]
    with pytest.raises(GrammarError, match=r"output 0: token \d+ follows a finished action"):
        model.token_logprobs(PROMPTS[:1], [[*add, add[0]]], [SPACE])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        model.token_logprobs(PROMPTS[:1], [add], [SPACE], temperature=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.token_logprobs(PROMPTS[:1], [[len(tokenizer) + 500]], [SPACE])
    with pytest.raises(ValueError, match="must match"):
        model.token_logprobs(PROMPTS, [add], [SPACE] * 3)


def test_on_policy_every_ratio_is_one_within_1e4_in_float32(tokenizer):
    """The exact-ratio claim: behaviour logprobs from the sampler, recomputed by the learner
    under the same mask and temperature, before any update."""
    model = hf(tokenizer)
    policy = HFPolicy(model, workers=1)
    reqs = [
        PolicyRequest(
            agent=i,
            turn=t,
            prompt=PROMPTS[i],
            space=SPACE,
            seed=7 * i + t,
            max_tokens=10,
            temperature=0.8,
        )
        for i in range(3)
        for t in range(4)
    ]
    answers = policy.sample(reqs)
    samples = [
        Sample(r.prompt, a.token_ids, SPACE, a.logprobs, 1.0 if i % 2 else -1.0, 1.0, 0)
        for i, (r, a) in enumerate(zip(reqs, answers, strict=True))
    ]
    lps, _ = model.token_logprobs(
        [s.prompt for s in samples], [s.tokens for s in samples], [SPACE] * 12, 0.8
    )
    for s, lp in zip(samples, lps, strict=True):
        assert lp.detach().tolist() == pytest.approx(s.logprobs, abs=1e-4)
    stats = Learner(model, read_config(dict(temperature=0.8, learning_rate=1e-3))).step(samples)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["clip_fraction"] == 0.0


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_a_step_moves_the_sampled_tokens_the_advantages_way_and_survives_a_reload(
    tokenizer, tmp_path, advantage
):
    model = hf(tokenizer, version=4)
    outputs = sampled(model)
    before = total(model, outputs)
    with torch.no_grad():  # behaviour logprobs: the model's own (on-policy)
        own = model.token_logprobs(PROMPTS, outputs, [SPACE] * 3)[0]
    samples = [
        Sample(p, o, SPACE, lp.tolist(), advantage, 1.0, 4)
        for p, o, lp in zip(PROMPTS, outputs, own, strict=True)
    ]
    Learner(model, read_config(dict(learning_rate=3e-3, clip=0.9))).step(samples)
    assert model.version == 5
    trained = total(model, outputs)

    path = model.save(tmp_path / "step-1")
    # the layout SGLang's /update_weights_from_disk and --policy hf:DIR read
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    assert (path / "tokenizer.json").is_file()
    assert json.loads((path / "collective.json").read_text()) == {"version": 5}
    reloaded = HFModel.load(path)
    assert reloaded.version == 5
    assert total(reloaded, outputs) == pytest.approx(trained, abs=1e-4)
    for b, a in zip(before, trained, strict=True):
        assert (a - b) * advantage > 0.02, (before, trained)


def test_lora_trains_only_adapters_and_its_kl_reference_is_the_base_model(tokenizer, tmp_path):
    start = hf(tokenizer).save(tmp_path / "start")
    model = HFModel.load(start, lora_rank=4, lora_alpha=8.0)
    base = HFModel.load(start)
    trained = {n for n, p in model.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert {id(p) for p in model.parameters()} == {
        id(p) for n, p in model.model.named_parameters() if n in trained
    }
    outputs = sampled(model)
    lps = model.token_logprobs(PROMPTS, outputs, [SPACE] * 3)[0]
    samples = [
        Sample(p, o, SPACE, lp.tolist(), 1.0, 1.0, 0)
        for p, o, lp in zip(PROMPTS, outputs, lps, strict=True)
    ]
    learner = Learner(model, read_config(dict(learning_rate=1e-2, kl_coef=0.1, clip=0.9)))
    assert learner.reference.model is model  # no copy: the same module, adapters switched off
    first = learner.step(samples)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # lora_B starts at zero: base == policy
    learner.step(samples)
    with torch.no_grad():
        ref = learner.reference.token_logprobs(PROMPTS, outputs, [SPACE] * 3)[0]
        want = base.token_logprobs(PROMPTS, outputs, [SPACE] * 3)[0]
    for r, w in zip(ref, want, strict=True):
        torch.testing.assert_close(r, w, atol=1e-6, rtol=0)  # the base never moved
    assert total(model, outputs) != pytest.approx(total(base, outputs), abs=1e-3)
    # saved merged: a plain model directory scoring what the adapters score
    merged = HFModel.load(model.save(tmp_path / "merged"))
    assert not merged.lora
    assert total(merged, outputs) == pytest.approx(total(model, outputs), abs=1e-4)


def test_gradient_checkpointing_gives_the_same_gradients(tokenizer, tmp_path):
    start = hf(tokenizer).save(tmp_path / "start")
    grads, ratios = [], []
    for gc in (False, True):
        model = HFModel.load(start, gradient_checkpointing=gc, logit_chunk=2)
        outputs = sampled(model)
        body = model.causal.get_decoder()
        counts = {"body": 0, "mlp": 0}
        for name, module in (("body", body), ("mlp", body.layers[0].mlp)):
            run = module.forward  # counted by hand: torch runs no hooks when it recomputes

            def counted(*a, run=run, name=name, counts=counts, **kw):
                counts[name] += 1
                return run(*a, **kw)

            module.forward = counted
        lps, _ = model.token_logprobs(PROMPTS, outputs, [SPACE] * 3)
        sum(lp.sum() for lp in lps).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        ratios.append(counts["mlp"] / counts["body"])
    assert ratios == [1, 2]  # checkpointed: each layer ran again in the backward pass
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


# -- bad input: one line, naming what and where, before anything trains ------------------------


def test_a_missing_directory_or_one_without_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model directory '.*nowhere' does not exist"):
        HFModel.load(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"not a Hugging Face model directory \(no config"):
        HFModel.load(tmp_path)


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path):
    from transformers import BertConfig, T5Config

    BertConfig(architectures=["BertForMaskedLM"]).save_pretrained(tmp_path / "bert")
    with pytest.raises(
        ValueError, match=r"bert is not a causal language model \(model_type 'bert'"
    ):
        check_model_dir(tmp_path / "bert")
    T5Config().save_pretrained(tmp_path / "t5")
    with pytest.raises(ValueError, match=r"t5 is not a causal language model"):
        HFModel.load(tmp_path / "t5")


def test_a_tokenizer_without_a_chat_template_is_refused(tokenizer, tmp_path):
    path = hf(tokenizer).save(tmp_path / "m")
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ValueError, match=r"/m: the tokenizer has no chat template"):
        HFModel.load(path)


def test_a_device_or_dtype_this_machine_cannot_do_is_refused():
    assert placement("cpu", "bfloat16") == (torch.device("cpu"), torch.bfloat16)  # slow, works
    with pytest.raises(ValueError, match="dtype must be one of"):
        placement("cpu", "float16")
    with pytest.raises(ValueError, match="device must be"):
        placement("tpu", "float32")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: 'cuda' is not bad input here")
    with pytest.raises(ValueError, match=r"device 'cuda' was asked for, but torch .* sees no CUDA"):
        placement("cuda", "float32")
    assert placement("auto", "float32")[0] == torch.device("cpu")

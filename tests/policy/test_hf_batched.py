"""The in-process Hugging Face policy decodes a batch as a batch and stays batch-invariant.

Real models (a Qwen2 with biases and grouped-query attention in ``tests/support/batch_probe.py``,
the ``tiny-lm`` of ``collective make-model``, a GPT-2 for the fallback), real xgrammar, real
kernels: the same request gives the same bytes alone, in batches of 1 to 257, reversed and at
every position of batches 1 to 8, under every kernel choice the probe can force; its logprobs
are the learner's to within float rounding; a model outside the Llama family decodes each
request alone and says so.
"""

from __future__ import annotations

import pytest
import torch

from collective import ActionSpace
from policy.base import PolicyRequest
from policy.hf.decoder import AloneDecoder, FixedDecoder, unsupported
from policy.hf.model import HFModel
from policy.hf.policy import HFPolicy
from tests.policy.test_tiny_policy import probe
from tests.support.hf_tiny import make_tokenizer, tiny_lm  # noqa: F401  (tiny_lm: a fixture)
from worlds.tally import Tally

SPACE = ActionSpace(Tally(3).tool_specs())


@pytest.mark.heavy
@pytest.mark.parametrize("setting", ["defaults", "mkl-compatible", "threads-3", "sse4.2"])
def test_batched_decoding_is_batch_invariant_whatever_kernels_the_libraries_pick(setting):
    """Batches of 1 to 257, a reversed batch of 65, three requests at every position of every
    batch of 1 to 8: bit-identical tokens and logprobs, under this CPU's defaults, MKL's
    compatibility mode (where a plain float32 product rounds a row otherwise by batch size: the
    control), three intra-op threads (the same answers as one: sampling fixes its own) and MKL
    and oneDNN capped at SSE4.2."""
    got = probe(setting, "hf")
    assert got["differ"] == [], f"{setting} ({got['capability']}): {got['differ']}"
    if setting == "mkl-compatible" and torch.backends.mkl.is_available():
        assert got["blas_batch_sizes_that_differ"], "plain products no longer vary: no control"
    if setting == "threads-3":
        assert got["answers"] == probe("defaults", "hf")["answers"]


def requests(n: int, space, max_tokens: int = 16) -> list[PolicyRequest]:
    return [
        PolicyRequest(
            agent=i % 7,
            turn=i,
            prompt=f"agent {i % 7}: count {i * 3} of 40" + " and more" * (i % 5),
            space=space,
            seed=500 + i,
            max_tokens=(4, max_tokens)[i % 2],
            temperature=(0.7, 1.0, 1.5)[i % 3],
        )
        for i in range(n)
    ]


def learner_recomputes(model: HFModel, batch: list[PolicyRequest], answers: list) -> None:
    """The learner's float32 forward gives every sampled logprob of the rows sampled at
    temperature 1 to within 1e-4 (the exact-sum decode rounds at about 1e-6 of the logits'
    scale on tiny-lm)."""
    logprobs, _ = model.token_logprobs(
        [r.prompt for r in batch],
        [a.token_ids for a in answers],
        [r.space for r in batch],
        temperature=1.0,
    )
    for r, a, lp in zip(batch, answers, logprobs, strict=True):
        if r.temperature == 1.0:
            assert torch.allclose(torch.tensor(a.logprobs), lp.detach(), atol=1e-4)


def test_tiny_lm_batched_equals_alone_and_the_learner_recomputes_its_logprobs(tiny_lm):  # noqa: F811
    """On the model a user builds: a batch of 24 (two sampling threads, so two shards) answers
    each request as it is answered alone; rows of 4 and 16 tokens finish at different steps;
    and the learner's float32 forward recomputes every sampled logprob to within 1e-4 (the
    exact-sum decode rounds at about 1e-6 of the logits' scale)."""
    model = HFModel.load(tiny_lm)
    assert unsupported(model.causal) is None  # qwen2: the exact-sum decoder
    policy = HFPolicy(model, workers=2)
    assert isinstance(policy.decoder(), FixedDecoder)
    space = SPACE
    batch = requests(24, space)
    together = policy.sample(batch)
    alone = [HFPolicy(model, workers=1).sample([r])[0] for r in batch]
    for a, b in zip(together, alone, strict=True):
        assert (a.token_ids, a.logprobs, a.text) == (b.token_ids, b.logprobs, b.text)
    assert {len(a.token_ids) for a in together} > {4}  # the long rows went on
    assert max(len(a.token_ids) for a in together[::2]) <= 4  # max_tokens held
    learner_recomputes(model, batch, together)


def test_a_model_outside_the_llama_family_decodes_each_request_alone():
    """A GPT-2 has no exact-sum decoder: ``unsupported`` names why, the policy decodes each
    request on its own, and that is batch-invariant too (no kernel sees two requests)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=512,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = HFModel(GPT2LMHeadModel(config).eval(), tokenizer)
    assert "model_type 'gpt2'" in (unsupported(model.causal) or "")
    with pytest.raises(ValueError, match=r"FixedDecoder: model_type 'gpt2'"):
        FixedDecoder(model.causal, model.cache_arg)
    policy = HFPolicy(model, workers=1)
    assert isinstance(policy.decoder(), AloneDecoder)
    space = SPACE
    batch = requests(6, space)
    together = policy.sample(batch)
    for r, a in zip(batch, together, strict=True):
        (b,) = policy.sample([r])
        assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)


def test_a_row_that_would_run_past_its_room_is_refused(tiny_lm):  # noqa: F811
    """The cache is sized for the batch's prompts and budgets; a caller stepping a row past it
    gets an error naming the cause, not a write into another row."""
    model = HFModel.load(tiny_lm)
    policy = HFPolicy(model, workers=1)
    space = SPACE
    (r,) = requests(1, space)
    from policy.hf.prompt import prompt_ids

    prompt = prompt_ids(model.tokenizer, r.prompt, r.space)
    head = policy._shared(prompt, r.space)
    rows, _ = policy.decoder().start([head], [prompt], [1])
    width = rows.keys[0].shape[2]
    with pytest.raises(ValueError, match="ran past the room"):
        for _ in range(width - len(prompt) + 1):
            rows.step([5])


def test_a_batch_fits_the_context_whenever_each_of_its_requests_does():
    """Rows are given their own budgets: a long prompt with a short budget beside a short
    prompt with a long one (each fits the model's 512 positions, the longest prompt plus the
    largest budget would not) decode together, each as alone."""
    from tests.support.hf_tiny import make_model

    tokenizer = make_tokenizer()
    model = HFModel(make_model(tokenizer, seed=4, vocab_size=len(tokenizer) + 64), tokenizer)
    policy = HFPolicy(model, workers=1)
    from policy.hf.prompt import prompt_ids

    long_prompt = "add 1 add 2 " * 48
    n_long = len(prompt_ids(tokenizer, long_prompt, SPACE))
    short = PolicyRequest(agent=0, turn=0, prompt="go", space=SPACE, seed=1, max_tokens=240)
    n_short = len(prompt_ids(tokenizer, "go", SPACE))
    room = 512 - n_long
    assert 0 < room < 240 and n_short + 240 <= 512, (n_long, n_short)
    long = PolicyRequest(agent=1, turn=0, prompt=long_prompt, space=SPACE, seed=2, max_tokens=room)
    together = policy.sample([long, short])
    for r, a in zip((long, short), together, strict=True):
        (b,) = policy.sample([r])
        assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)


def test_lora_adapters_are_decoded_not_just_prefilled(tiny_lm):  # noqa: F811
    """Under LoRA a layer's ``.weight`` is the base weight alone: the exact-sum decoder must use
    the adapters merged in, or every token after the first comes from the base model. With
    non-zero adapters the learner (adapters applied) recomputes every sampled logprob."""
    model = HFModel.load(tiny_lm, lora_rank=4)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # peft starts B at zero: the adapters would change nothing
    policy = HFPolicy(model, workers=1)
    batch = [r for r in requests(8, SPACE) if r.temperature == 1.0]
    answers = policy.sample(batch)
    assert max(len(a.token_ids) for a in answers) > 2  # decode steps, not just the prefill
    logprobs, _ = model.token_logprobs(
        [r.prompt for r in batch], [a.token_ids for a in answers], [r.space for r in batch]
    )
    for a, lp in zip(answers, logprobs, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), lp.detach(), atol=1e-4)


def test_the_head_computes_only_the_allowed_tokens_and_changes_no_answer(tiny_lm, monkeypatch):  # noqa: F811
    """A decode step's head computes only the tokens some row's grammar allows (tally's actions
    and numbers: a few of the vocabulary), and every answer is the same bits as with the whole
    head; each computed logit is the whole head's, bit for bit."""
    from policy.hf import decoder

    model = HFModel.load(tiny_lm)
    batch = requests(8, SPACE)
    narrowed = []
    linear = decoder._Linear.__call__

    def call(self, x, lora=None, outputs=None):
        got = linear(self, x, lora, outputs)
        if outputs is not None:
            narrowed.append(len(outputs))
            assert torch.equal(got, linear(self, x)[:, outputs])
        return got

    monkeypatch.setattr(decoder._Linear, "__call__", call)
    restricted = HFPolicy(model, workers=1).sample(batch)
    assert narrowed and max(narrowed) <= decoder.HEAD_SHARE * model.vocab_size
    monkeypatch.setattr(decoder, "HEAD_SHARE", 0.0)  # the whole head at every step
    calls = len(narrowed)
    whole = HFPolicy(model, workers=1).sample(batch)
    assert len(narrowed) == calls
    assert [(a.token_ids, a.logprobs) for a in restricted] == [
        (a.token_ids, a.logprobs) for a in whole
    ]


def test_lora_versions_share_one_base_and_decode_as_a_model_of_their_own_would(tiny_lm):  # noqa: F811
    """Two served versions of a LoRA run are copies holding the learner's base tensors and one
    set of the decoder's base matrices; each adds its adapters only. Sharing changes no bit: a
    version answers as the same adapters loaded into a model of their own (its own base tensors
    and matrices) answer. The versions' adapters differ, and so do their answers; a base built
    from other tensors is refused."""
    model = HFModel.load(tiny_lm, lora_rank=4)
    torch.manual_seed(1)
    states = []
    for _ in range(2):
        with torch.no_grad():
            for name, p in model.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
        states.append(model.trainable_state())
    v1, v2 = (model.copy(state, v) for v, state in enumerate(states, start=1))
    learner_q = model.causal.model.layers[0].self_attn.q_proj
    for version in (v1, v2):
        q = version.causal.model.layers[0].self_attn.q_proj
        assert q.base_layer.weight is learner_q.base_layer.weight
        assert q.lora_A["default"].weight is not learner_q.lora_A["default"].weight
    p1, p2 = HFPolicy(v1, workers=1), HFPolicy(v2, workers=1)
    d1, d2 = p1.decoder(), p2.decoder()
    assert isinstance(d1, FixedDecoder) and isinstance(d2, FixedDecoder)
    assert d1.base is d2.base and 0 < d1.adapter_nbytes() < d1.base.nbytes() // 20
    batch = requests(8, SPACE)
    a1, a2 = p1.sample(batch), p2.sample(batch)
    assert [a.token_ids for a in a1] != [a.token_ids for a in a2]
    own = HFModel.load(tiny_lm, lora_rank=4)
    own.load_trainable_state(states[0])
    alone = HFPolicy(own, workers=1)
    assert [(a.token_ids, a.logprobs) for a in alone.sample(batch)] == [
        (a.token_ids, a.logprobs) for a in a1
    ]
    with pytest.raises(ValueError, match="built from other weights"):
        FixedDecoder(own.causal, own.cache_arg, d1.base)
    # a state holding a base tensor would write the base every version shares: refused
    base_name = next(n for n in model.model.state_dict() if "q_proj.base_layer.weight" in n)
    before = learner_q.base_layer.weight.clone()
    stray = {**states[0], base_name: torch.zeros_like(before)}
    with pytest.raises(ValueError, match="1 tensors that do not train"):
        model.copy(stray, 3)
    assert torch.equal(learner_q.base_layer.weight, before)


@pytest.mark.heavy
def test_smollm2s_shape_batched_equals_alone_and_the_learner_recomputes_its_logprobs():
    """SmolLM2-135M's shapes where the decoder could go wrong (a Llama: 9 query heads over 3
    key-value heads of 64, 30 layers, the head tied to the embedding, no biases), its widths cut
    where they change nothing the decoder does (a 64-unit feed-forward, the test tokenizer's
    vocabulary), random weights: a batch of 8 answers each request as it is answered alone, in
    reverse too, and the learner's float32 forward recomputes every logprob within 1e-4."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=576,
        intermediate_size=64,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = HFModel(LlamaForCausalLM(config).eval(), tokenizer)
    assert model.causal.get_output_embeddings().weight is model.causal.model.embed_tokens.weight
    policy = HFPolicy(model, workers=1)
    assert isinstance(policy.decoder(), FixedDecoder)
    batch = requests(8, SPACE, max_tokens=12)
    together = policy.sample(batch)
    backwards = policy.sample(batch[::-1])[::-1]
    alone = [policy.sample([r])[0] for r in batch]
    for a, b, c in zip(together, backwards, alone, strict=True):
        assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs) == (c.token_ids, c.logprobs)
    learner_recomputes(model, batch, together)

"""The in-process Hugging Face policy (``--policy hf:DIR``) and its xgrammar constraint.

Real models built here (the tiny Llama of ``hf_tiny`` and the ``tiny-lm`` of ``collective
make-model``), real xgrammar, real trio episodes: every answer is a valid action of its space,
the same seed gives the same tokens alone or in any batch, logprobs are those of the masked,
tempered distribution, ``max_tokens`` holds, and an episode run with it replays identically.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from collective import ActionSpace, ArgSpec, EpisodeConfig, ToolSpec, parse_action, run_episodes
from collective.replay import verify
from policy.base import PolicyError, PolicyRequest
from policy.factory import make_policy
from policy.hf import grammar as hf_grammar
from policy.hf.grammar import masked_logits, unpack
from policy.hf.model import HFModel
from policy.hf.policy import HFPolicy, draw
from tests.support.hf_tiny import make_model, make_tokenizer, tiny_lm  # noqa: F401  (tiny_lm: a fixture)
from worlds.tally import Tally

WAIT = ToolSpec("wait", (ArgSpec("seconds", "int", lo=0, hi=600),), "wait")
SPACE = ActionSpace((*Tally(3).tool_specs(), WAIT))
SMALL = ActionSpace((ToolSpec("add", (ArgSpec("amount", "int", lo=1, hi=3),)),))


@pytest.fixture(scope="module")
def model() -> HFModel:
    tokenizer = make_tokenizer()
    return HFModel(make_model(tokenizer, seed=3, vocab_size=len(tokenizer) + 64), tokenizer)


def request(i: int, *, space: ActionSpace = SPACE, max_tokens: int = 16, **kw) -> PolicyRequest:
    return PolicyRequest(
        agent=i % 5,
        turn=i,
        prompt=f"agent {i % 5}: count {i} of 30",
        space=space,
        seed=1000 + i,
        max_tokens=max_tokens,
        **kw,
    )


def test_answers_are_valid_actions_ending_in_a_stop_token(model):
    policy = HFPolicy(model)
    answers = policy.sample([request(i) for i in range(10)])
    stop = set(model.grammar.stop_ids)
    for a in answers:
        assert 1 <= len(a.token_ids) <= 16 and len(a.logprobs) == len(a.token_ids)
        assert all(lp <= 0 for lp in a.logprobs)
        if a.token_ids[-1] in stop:  # finished: the text is one action of the space
            assert parse_action(a.text, SPACE).tool in {t.name for t in SPACE.tools}
        else:  # cut by max_tokens, as SGLang cuts it ("length"); never longer
            assert len(a.token_ids) == 16
        assert a.version == model.version and a.prompt_tokens > 10
    assert sum(a.token_ids[-1] in stop for a in answers) >= 5


def test_max_tokens_is_enforced_and_a_forced_stop_costs_nothing(model):
    (one,) = HFPolicy(model).sample([request(0, max_tokens=1)])
    assert len(one.token_ids) == 1
    # "add N" then the stop token: once the action is complete, the stop token is forced
    answers = HFPolicy(model).sample([request(i, space=SMALL) for i in range(6)])
    for a in answers:
        assert parse_action(a.text, SMALL).tool == "add"
        assert a.token_ids[-1] in model.grammar.stop_ids and a.logprobs[-1] == 0.0


@settings(max_examples=8, deadline=None)
@given(st.permutations(list(range(6))), st.integers(1, 6))
def test_a_request_samples_the_same_tokens_alone_or_in_any_batch(model, order, size):
    """Batch invariance by construction: each request decodes at shapes of its own."""
    alone = {i: HFPolicy(model, workers=1).sample([request(i)])[0] for i in range(6)}
    picked = order[:size]
    together = HFPolicy(model, workers=2).sample([request(i) for i in picked])
    for i, a in zip(picked, together, strict=True):
        assert a.token_ids == alone[i].token_ids and a.logprobs == alone[i].logprobs


def test_seeds_name_the_tokens_and_different_seeds_differ(model):
    base = request(3)
    again = HFPolicy(model).sample([base, base])
    assert again[0].token_ids == again[1].token_ids
    others = HFPolicy(model).sample(
        [PolicyRequest(**{**_fields(base), "seed": s}) for s in range(12)]
    )
    assert len({tuple(a.token_ids) for a in others}) > 3


def _fields(r: PolicyRequest) -> dict:
    return {f: getattr(r, f) for f in r.__struct_fields__}


def test_logprobs_are_of_the_masked_tempered_distribution(model):
    (a,) = HFPolicy(model).sample([request(5, temperature=0.6)])
    lps, _ = model.token_logprobs([request(5).prompt], [a.token_ids], [SPACE], temperature=0.6)
    assert lps[0].tolist() == pytest.approx(a.logprobs, abs=1e-5)
    untempered, _ = model.token_logprobs([request(5).prompt], [a.token_ids], [SPACE])
    assert untempered[0].tolist() != pytest.approx(a.logprobs, abs=1e-3)


def test_logprobs_are_of_the_nucleus_sampled_from(model):
    """With ``top_p``, the sampler's logprobs are the renormalised nucleus's, and the learner
    recomputes them (ratio 1 on-policy); the full distribution gives others."""
    answers = HFPolicy(model).sample([request(i, temperature=0.8, top_p=0.5) for i in range(6)])
    outs = [a.token_ids for a in answers]
    prompts = [request(i).prompt for i in range(6)]
    lps, _ = model.token_logprobs(prompts, outs, [SPACE] * 6, temperature=0.8, top_p=0.5)
    for lp, a in zip(lps, answers, strict=True):
        assert lp.tolist() == pytest.approx(a.logprobs, abs=1e-5)
    full, _ = model.token_logprobs(prompts, outs, [SPACE] * 6, temperature=0.8)
    assert torch.cat(full).tolist() != pytest.approx(torch.cat(lps).tolist(), abs=1e-3)
    assert all(v <= 0 for lp in lps for v in lp.tolist())


def test_the_nucleus_is_sglangs_the_most_likely_token_always_in():
    """SGLang's rule: sorted by probability, a token stays while the mass before it is at most
    top_p; tokens the grammar forbids stay forbidden."""
    p = torch.tensor([[0.05, 0.5, 0.15, 0.3, 0.0]])
    logits = torch.log(p.clamp(min=1e-12))
    everything = torch.full((1, 1), -1, dtype=torch.int32)  # every bit set: all allowed

    def kept(top_p: float) -> list[int]:
        z = masked_logits(logits, 1.0, everything, top_p)
        return [i for i in range(5) if z[0, i] > -1e29]

    assert kept(1.0) == [0, 1, 2, 3, 4]
    assert kept(0.7) == [1, 3]  # mass before: 0.5 for token 3, 0.8 for token 2
    assert kept(0.85) == [1, 2, 3]
    assert kept(0.01) == [1]
    forbid_1 = torch.tensor([[~(1 << 1)]], dtype=torch.int32)
    z = masked_logits(logits, 1.0, forbid_1, 0.5)  # 3 is now the most likely: 0.3 of 0.5
    assert [i for i in range(5) if z[0, i] > -1e29] == [3]
    z = masked_logits(logits, 1.0, forbid_1, 0.61)  # mass before 2: 0.6 (3 has 0.3 of 0.5)
    assert [i for i in range(5) if z[0, i] > -1e29] == [2, 3]


def test_the_unpacked_mask_is_xgrammars_own():
    """Our unpacking (used on every device, and differentiable) against xgrammar's CPU kernel."""
    import xgrammar as xgr

    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 5), dtype=torch.int32)
    logits = torch.zeros(3, 150)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=150)
    assert torch.equal(unpack(bitmask, 150), logits == 0)
    z = masked_logits(torch.ones(3, 150), 0.5, bitmask)
    assert torch.equal(z == 2.0, logits == 0) and bool((z[logits != 0] < -1e29).all())


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 5), min_size=2, max_size=8), st.floats(0, 1, exclude_max=True))
def test_draw_inverts_the_cdf_and_never_picks_a_forbidden_token(weights, u):
    p = torch.tensor(weights, dtype=torch.float64)
    if p.sum() == 0:
        p[0] = 1.0
    logp = torch.log(p / p.sum()).float()
    token = draw(logp, u)
    assert p[token] > 0
    cdf = torch.cumsum(p / p.sum(), 0)
    assert cdf[token] >= u - 1e-6 and (token == 0 or cdf[token - 1] <= u + 1e-6)


def test_bad_requests_and_grammars_are_refused_before_sampling(model, monkeypatch):
    policy = HFPolicy(model)
    with pytest.raises(PolicyError, match=r"agent 1 turn 1: temperature must be > 0"):
        policy.sample([request(0), request(1, temperature=0.0)])
    with pytest.raises(PolicyError, match=r"pinned to version 7"):
        policy.sample([request(0, version=7)])
    with pytest.raises(PolicyError, match=r"exceed the model's 512 positions"):
        policy.sample([request(0, max_tokens=500)])
    # action_ebnf is total over valid action spaces, so no world can produce a grammar xgrammar
    # refuses; a broken one is fed in here to check what the user would see if it happened.
    monkeypatch.setattr(hf_grammar, "action_ebnf", lambda space: "root ::= undefined")
    fresh = HFModel(model.model, model.tokenizer)  # a grammar cache of its own
    with pytest.raises(
        PolicyError,
        match=r"agent 0 turn 0: xgrammar cannot compile the action "
        r"grammar of tools \[add, mark, note.*undefined",
    ):
        HFPolicy(fresh).sample([request(0)])


# -- the whole policy, as the command line uses it --------------------------------------------


def test_hf_dir_runs_episodes_that_replay_identically_whatever_the_batches(tiny_lm):  # noqa: F811
    policy = make_policy(f"hf:{tiny_lm}")
    assert policy.name == f"hf:{tiny_lm}"
    configs = [
        EpisodeConfig(
            world="tally",
            agents=3,
            world_seed=5,
            sample_seed=s,
            time_limit=25.0,
            max_output_tokens=12,
            policy=policy.name,
        )
        for s in range(2)
    ]
    together = run_episodes(configs, policy, concurrency=2)  # one batch holds both episodes
    alone = [run_episodes([c], policy)[0] for c in configs]
    for a, b in zip(together, alone, strict=True):
        assert a.turns == b.turns and a.events == b.events
        assert verify(a) is None
    assert sum(t.kind != "invalid" for e in together for t in e.turns) > 0


def test_the_command_line_names_a_missing_model_directory_in_one_line(tmp_path, capsys):
    from collective.cli import main

    assert main(["run", "tally", "--policy", f"hf:{tmp_path / 'nothing'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"collective run: error: model directory '{tmp_path / 'nothing'}' does not exist"
    ]

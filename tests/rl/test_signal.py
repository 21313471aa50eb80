"""A trainer that keeps what it learns: no step without signal, dynamic sampling, the KL
estimators. Real tiny models, real episodes, real runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from collective import EpisodeConfig, run_episodes
from collective.rl.backend import TinyBackend
from collective.rl.config import read_config
from collective.rl.learner import Learner, Sample, kl_estimate, token_chunks
from collective.rl.train import read_metrics, train
from policy.tiny import TinyConfig, TinyModel, TinyPolicy
from tests.support.training import comparable_metrics, small_train

NET = TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=96)


def _samples(advantage: float) -> list[Sample]:
    """Every answered turn of two real tally episodes of an untrained model, at ``advantage``."""
    cfgs = [
        EpisodeConfig(
            world="tally",
            agents=2,
            world_seed=s,
            sample_seed=s,
            time_limit=30,
            max_output_tokens=12,
            tokenizer="bytes",
        )
        for s in (1, 2)
    ]
    eps = run_episodes(cfgs, TinyPolicy(TinyModel.fresh(NET)))
    return [
        Sample(t.prompt, t.token_ids, e.spaces[t.space], t.logprobs, advantage, 1.0, 0)
        for e in eps
        for t in e.turns
        if t.token_ids
    ]


def _state(model: TinyModel) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.net.state_dict().items()}


def test_a_batch_without_advantage_moves_no_weight_and_no_adam_moment() -> None:
    """After a real step, a step whose advantages are all 0 changes nothing: not the weights
    (Adam's momentum alone would move them), not the optimiser's moments or step count."""
    cfg = read_config(dict(model=NET, max_output_tokens=12, learning_rate=1e-2))
    model = TinyModel.fresh(NET)
    learner = Learner(model, cfg, TinyBackend(cfg))  # (max_output_tokens = 12)
    assert learner.step(_samples(0.5))["optimiser_step"] is True
    weights, moments = _state(model), msgspec.json.encode(str(learner.state()))
    version = model.version
    stats = learner.step(_samples(0.0))
    assert stats["optimiser_step"] is False and stats["trained_tokens"] == 0
    assert model.version == version + 1, "the version still counts the step"
    after = _state(model)
    assert all(torch.equal(weights[k], after[k]) for k in weights)
    assert msgspec.json.encode(str(learner.state())) == moments
    # what the old step did: Adam stepped on the zero gradient, and its momentum moved weights
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    learner.optimiser.step()
    assert any(not torch.equal(weights[k], v) for k, v in model.net.state_dict().items())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50), max_size=30), st.integers(0, 120), st.integers(1, 8))
def test_chunks_by_tokens_cover_the_step_in_order_and_stop_at_the_first_overflow(
    sizes: list[int], budget: int, turns: int
) -> None:
    chunks = token_chunks(sizes, budget, turns)
    assert [i for c in chunks for i in c] == list(range(len(sizes)))
    for at, c in enumerate(chunks):
        after = chunks[at + 1] if at + 1 < len(chunks) else None
        held = sum(sizes[i] for i in c)
        assert 1 <= len(c) <= turns
        assert budget == 0 or held <= budget or len(c) == 1  # a long turn goes alone
        if after is not None:  # greedy: the next sample would have broken a bound
            assert len(c) == turns or (budget > 0 and held + sizes[after.start] > budget)


def test_chunks_without_a_token_budget_are_the_turn_chunks() -> None:
    assert token_chunks([0] * 7, 0, 3) == [range(0, 3), range(3, 6), range(6, 7)]


@pytest.mark.parametrize("budget", [1, 300, 2000])
def test_two_chunkings_of_a_step_give_the_same_update(budget: int) -> None:
    """The loss is normalised over the whole step, so chunking it by tokens changes the
    gradient by float summation order alone: the step's gradient, and the weights after it,
    agree to float tolerance with those of the step in one chunk (a real tiny model, real tally
    turns). (Adam's first update is about lr * sign(g), so a weight whose gradient is near 0
    moves by a float-noise-sized fraction of lr: the weights are compared at lr's scale.)"""
    samples = _samples(0.5)
    after = []
    grads = []
    for tokens in (0, budget):
        cfg = read_config(
            dict(model=NET, max_output_tokens=12, learning_rate=1e-2, chunk_tokens=tokens)
        )
        model = TinyModel.fresh(NET)
        learner = Learner(model, cfg, TinyBackend(cfg))
        stats = learner.step(samples)
        after.append((_state(model), stats))
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    (one, a), (many, b) = after
    assert a["trained_tokens"] == b["trained_tokens"]
    assert math.isclose(a["loss"], b["loss"], rel_tol=1e-5, abs_tol=1e-7)
    assert math.isclose(a["grad_norm"], b["grad_norm"], rel_tol=1e-4)
    assert len(grads[0]) == len(grads[1]) > 0
    for g, h in zip(*grads, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-7)
    for k in one:
        torch.testing.assert_close(one[k], many[k], rtol=0, atol=1e-2 * 1e-3)
    sizes = TinyBackend(read_config(dict(model=NET, max_output_tokens=12))).token_counts(
        TinyModel.fresh(NET),
        [s.prompt for s in samples],
        [s.tokens for s in samples],
        [s.space for s in samples],
    )
    assert len(token_chunks(sizes, budget, 512)) > 1 or sum(sizes) <= budget


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-30, 0), min_size=1, max_size=20),
    st.lists(st.floats(-30, 0), min_size=1, max_size=20),
)
def test_k3_is_never_negative_and_both_vanish_on_the_reference(
    a: list[float], b: list[float]
) -> None:
    n = min(len(a), len(b))
    new, ref = torch.tensor(a[:n], dtype=torch.float64), torch.tensor(b[:n], dtype=torch.float64)
    assert (kl_estimate(new, ref, "k3") >= 0).all()
    for est in ("k1", "k3"):
        assert torch.equal(kl_estimate(new, new, est), torch.zeros(n, dtype=torch.float64))


def test_both_estimators_average_to_the_kl_over_sampled_tokens() -> None:
    """E_{x~pi}[k1] = E_{x~pi}[k3] = KL(pi || pi_ref), checked by sampling a categorical."""
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    kl = float(np.sum(p * np.log(p / q)))
    x = rng.choice(6, size=200_000, p=p)
    new = torch.tensor(np.log(p[x]))
    ref = torch.tensor(np.log(q[x]))
    for est in ("k1", "k3"):
        assert math.isclose(float(kl_estimate(new, ref, est).mean()), kl, rel_tol=0.03), est


def _ledger(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines()]


@pytest.mark.heavy
def test_dynamic_sampling_replaces_groups_without_signal_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    """With ``resample``, each group whose returns are all equal is replaced by a reserve
    group of the step while the budget lasts: the dropped ones are named in the ledger and
    kept on disk, never trained on; a run stopped after a step and resumed equals one run
    straight through (which reserves were drawn is a function of the returns alone)."""
    cfg = small_train(
        steps=3, resample=4, team_sizes=(1,), time_limit_start=20.0, time_limit_end=20.0
    )
    train(cfg, tmp_path / "a", progress=False)
    rows = read_metrics(tmp_path / "a")
    assert sum(m.resampled_groups for m in rows) > 0, "some group had no signal"
    for m, line in zip(rows, _ledger(tmp_path / "a"), strict=True):
        assert m.resampled_groups <= cfg.resample
        assert m.resampled_groups * cfg.group_size == len(line["flat"])
        # every group trained on has signal, unless the reserves ran out first
        assert m.signal_groups == cfg.groups_per_step or m.resampled_groups == cfg.resample
        for name in line["flat"]:
            assert (tmp_path / "a" / "episodes" / name).is_file()
            assert name not in line["used"]
    train(cfg, tmp_path / "b", progress=False, stop_after=1)
    train(cfg, tmp_path / "b", resume=True, progress=False)
    assert comparable_metrics(tmp_path / "a") == comparable_metrics(tmp_path / "b")
    assert _ledger(tmp_path / "a") == _ledger(tmp_path / "b")


def test_a_run_without_signal_says_so_once_and_changes_no_weight(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A limit so short that nobody finishes anything: every return is 0, no group carries
    signal, no weight changes, and train says so in one line with the refused share, then how
    many steps in a row."""
    cfg = small_train(steps=3, time_limit_start=1.0, time_limit_end=1.0)
    train(cfg, tmp_path / "run", progress=False)
    rows = read_metrics(tmp_path / "run")
    assert [m.signal_groups for m in rows] == [0, 0, 0]
    assert not any(m.optimiser_step for m in rows)
    err = capsys.readouterr().err
    assert err.count("learned nothing: no group carries signal") == 1, err
    assert "refused" in err and "steps 0-2 (3 in a row)" in err
    first = TinyModel.fresh(cfg.tiny).net.state_dict()
    last = TinyModel.load(tmp_path / "run" / "checkpoints" / "latest.pt").net.state_dict()
    assert all(torch.equal(first[k], last[k]) for k in first)

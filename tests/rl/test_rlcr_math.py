"""The advantage and loss math of RLCR, as unit and property tests (no model needed: the
token log-probabilities are free parameters here, so each token's movement is its own)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from collective.rl.config import read_config
from collective.rl.train import (
    clipped_pg_loss,
    group_advantages,
    load_config,
    penalised_returns,
    time_limit_at,
)

returns = st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=16).map(np.array)


@given(returns, st.booleans())
def test_group_baselines_sum_to_zero(r: np.ndarray, normalise: bool) -> None:
    adv = group_advantages(r, normalise)
    assert abs(adv.sum()) < 1e-6 * max(1.0, len(r))
    assert np.all(
        np.sign(adv[np.abs(r - r.mean()) > 1e-9])
        == np.sign((r - r.mean())[np.abs(r - r.mean()) > 1e-9])
    )


@given(returns)
def test_std_normalisation_gives_unit_spread(r: np.ndarray) -> None:
    if r.std() < 1e-3:
        return
    assert group_advantages(r, True).std() == pytest.approx(1.0, rel=1e-3)


def test_the_latency_penalty_is_applied_as_written() -> None:
    scores = np.array([1.0, 0.5, 0.0, 0.5])
    durations = np.array([100.0, 400.0, 400.0, 200.0])
    pbar = scores.mean()
    got = penalised_returns(scores, durations, t_max=400.0, beta=0.3)
    want = scores - 0.3 * pbar * durations / 400.0
    assert np.allclose(got, want)
    assert got[0] > got[3] > got[1], "finishing sooner pays, at equal score"
    assert np.array_equal(penalised_returns(scores, durations, 400.0, 0.0), scores)


@pytest.mark.parametrize(
    ("kind", "end"), [("constant", 100.0), ("linear", 250.0), ("geometric", 200.0)]
)
def test_time_limit_schedules(kind: str, end: float) -> None:
    cfg = read_config(dict(steps=11, time_limit=kind, time_limit_start=100.0, time_limit_end=end))
    values = [time_limit_at(cfg, s) for s in range(11)]
    assert values[0] == 100.0 and values[-1] == pytest.approx(end)
    if kind == "linear":
        assert values[5] == pytest.approx(175.0)
    if kind == "geometric":
        assert values[5] == pytest.approx(100.0 * 2**0.5)
    assert values == sorted(values)


def _step(adv: list[float], aggregation: str, clip: float = 0.2, lr: float = 0.05) -> torch.Tensor:
    """One gradient step on free per-token logits; returns how each token's logprob moved."""
    torch.manual_seed(0)
    n_tok, vocab = len(adv), 5
    logits = torch.randn(n_tok, vocab, requires_grad=True)
    sampled = torch.randint(0, vocab, (n_tok,))
    old = torch.log_softmax(logits, -1).gather(1, sampled[:, None]).squeeze(1).detach()
    seq = torch.arange(n_tok) // 2
    new = torch.log_softmax(logits, -1).gather(1, sampled[:, None]).squeeze(1)
    loss, _ = clipped_pg_loss(
        new,
        old,
        torch.tensor(adv),
        torch.ones(n_tok),
        seq,
        float(n_tok),
        float(seq.max() + 1),
        aggregation,
        64.0,
        clip,
    )
    loss.backward()
    with torch.no_grad():
        moved = (
            torch.log_softmax(logits - lr * logits.grad, -1).gather(1, sampled[:, None]).squeeze(1)
        )
    return moved - old


@given(
    st.lists(st.floats(-1, 1).filter(lambda a: abs(a) > 1e-3), min_size=2, max_size=12),
    st.sampled_from(["token_mean", "sequence_mean", "constant"]),
)
def test_each_token_moves_with_the_sign_of_its_rollouts_advantage(
    adv: list[float], agg: str
) -> None:
    delta = _step(adv, agg)
    assert torch.all(torch.sign(delta) == torch.sign(torch.tensor(adv)))


@given(st.floats(0.05, 0.5), st.floats(-3, 3), st.sampled_from([-1.0, 1.0]))
def test_the_clip_bounds_the_ratio(clip: float, log_ratio: float, sign: float) -> None:
    """Past the clip on the side the advantage favours, a token gets no gradient at all; inside
    it, it always does. So one step can never push the ratio far beyond 1 +/- clip."""
    new = torch.tensor([log_ratio], requires_grad=True)
    loss, was_clipped = clipped_pg_loss(
        new,
        torch.zeros(1),
        torch.tensor([sign]),
        torch.ones(1),
        torch.zeros(1, dtype=torch.long),
        1.0,
        1.0,
        "token_mean",
        1.0,
        clip,
    )
    loss.backward()
    ratio = float(np.exp(log_ratio))
    beyond = ratio > 1 + clip if sign > 0 else ratio < 1 - clip
    if beyond:
        assert new.grad.item() == 0.0 and was_clipped.item()
    else:
        assert new.grad.item() != 0.0 and not was_clipped.item()


def test_aggregations_weigh_tokens_as_named() -> None:
    # Two sequences: one of 1 token, one of 3, all with unit loss contribution at ratio 1.
    new = torch.zeros(4, requires_grad=True)
    seq = torch.tensor([0, 1, 1, 1])
    kw = dict(
        old_logp=torch.zeros(4),
        advantage=-torch.ones(4),
        weight=torch.ones(4),
        seq=seq,
        n_tokens=4.0,
        n_seqs=2.0,
        normaliser=10.0,
        clip=0.2,
    )
    token, _ = clipped_pg_loss(new, aggregation="token_mean", **kw)
    sequence, _ = clipped_pg_loss(new, aggregation="sequence_mean", **kw)
    constant, _ = clipped_pg_loss(new, aggregation="constant", **kw)
    assert token.item() == pytest.approx(1.0)  # 4 tokens / 4
    assert sequence.item() == pytest.approx(1.0)  # (1/1 + 3/3) / 2
    assert constant.item() == pytest.approx(0.4)  # 4 / 10
    g_seq = torch.autograd.grad(clipped_pg_loss(new, aggregation="sequence_mean", **kw)[0], new)[0]
    assert g_seq[0] == pytest.approx(3 * g_seq[1].item()), "a lone token counts as a whole sequence"


def test_configs_are_validated_with_the_field_named(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = 3\nlearning_rate = 'fast'\n")
    with pytest.raises(ValueError, match="learning_rate"):
        load_config(bad)
    bad.write_text("stepz = 3\n")
    with pytest.raises(ValueError, match="stepz"):
        load_config(bad)
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        read_config(dict(group_size=1))
    ok = tmp_path / "ok.toml"
    ok.write_text("steps = 3\n[model]\nd_model = 32\n")
    cfg = load_config(ok, ["steps=5", "model.n_layers=1", "world=examples/garden.py:Garden"])
    assert (cfg.steps, cfg.model.d_model, cfg.model.n_layers) == (5, 32, 1)
    assert cfg.worlds[0].world == "examples/garden.py:Garden"

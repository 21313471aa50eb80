"""Per-turn credit from forks (``advantage = "turn"``, collective/rl/forks.py), on real episodes
of the tiny policy: a forked turn's advantage is the episode's score minus the mean score of its
forks (each re-sampled from the instant the turn was asked), chosen turns are the trained
policy's answered ones, everything is a function of the seeds, and step_samples gives the
forked turns their own advantage and every other turn its rollout's flat one."""

from __future__ import annotations

from pathlib import Path

import pytest

from collective import EpisodeConfig, run_episodes
from collective.records.signs import score_at
from collective.replay import fork, prefix
from collective.rl.config import Turn, read_config
from collective.rl.forks import group_turn_advantages, sample_turns, turn_advantages
from collective.rl.train import TrainConfig, group_advantages, step_samples
from policy.tiny import TinyConfig, TinyModel, TinyPolicy

MODEL = TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=96, seed=3)


@pytest.fixture(scope="module")
def group() -> list:
    cfgs = [
        EpisodeConfig(
            world="tally",
            params={"target": 12},
            agents=2,
            world_seed=5,
            sample_seed=i,
            time_limit=40.0,
            max_output_tokens=12,
            tokenizer="bytes",
        )
        for i in range(2)
    ]
    return run_episodes(cfgs, TinyPolicy(TinyModel.fresh(MODEL)))


def policy() -> TinyPolicy:
    return TinyPolicy(TinyModel.fresh(MODEL))


def test_sampled_turns_are_the_trained_policys_answered_turns_drawn_by_seed(group: list) -> None:
    ep = group[0]
    answered = {i for i, t in enumerate(ep.turns) if t.policy == "trained" and t.token_ids}
    assert len(answered) >= 4
    picked = sample_turns(ep, 3, seed=11)
    assert len(picked) == 3 and set(picked) <= answered and picked == sorted(picked)
    assert sample_turns(ep, 3, seed=11) == picked  # a function of the seed
    assert any(sample_turns(ep, 3, seed=s) != picked for s in range(12, 20))
    assert set(sample_turns(ep, 10_000, seed=1)) == answered  # never more than there are


def test_a_turns_advantage_is_its_return_minus_its_forks_mean(group: list) -> None:
    ep = group[0]
    turns = sample_turns(ep, 2, seed=4)
    adv, runs = turn_advantages(ep, policy(), turns, samples=2, horizon=0.0, seed=9)
    assert set(adv) == set(turns) and runs == 4
    again, _ = turn_advantages(ep, policy(), turns, samples=2, horizon=0.0, seed=9)
    assert again == adv  # forks are deterministic given their seeds
    # by hand, for the first turn: the same forks, through collective.replay.fork
    from collective.base.seeding import derive
    from collective.rl.forks import _FORK_SALT

    i = turns[0]
    asked = ep.turns[i].asked
    forks = [fork(ep, asked, policy(), sample_seed=derive(_FORK_SALT, 9, i, k)) for k in range(2)]
    for f in forks:  # each shares the episode's history up to the turn
        assert prefix(f.events, asked) == prefix(ep.events, asked)
    want = ep.score - sum(f.score for f in forks) / 2
    assert adv[i] == pytest.approx(want)
    # a horizon reads every return at the same instant after the fork
    short, _ = turn_advantages(ep, policy(), [i], samples=2, horizon=5.0, seed=9)
    at = min(asked + 5.0, ep.config.time_limit)
    assert short[i] == pytest.approx(score_at(ep, at) - sum(score_at(f, at) for f in forks) / 2)


def test_step_samples_give_forked_turns_their_own_advantage(group: list) -> None:
    credit, runs = group_turn_advantages(
        [group], lambda ep: policy(), turns=2, samples=1, horizon=0.0, seed=0
    )
    assert runs == 4 and [len(d) for d in credit[0]] == [2, 2]
    cfg = read_config(dict(advantage="turn", team_sizes=(2,), groups_per_step=1, group_size=2))
    samples, _, used = step_samples(cfg, 0, [group], credit)
    assert all(used)
    flat = group_advantages(__import__("numpy").array([e.score for e in group]), False)
    want = [
        credit[0][i].get(j, flat[i])
        for i, e in enumerate(group)
        for j, t in enumerate(e.turns)
        if t.policy == "trained" and t.token_ids
    ]
    assert [s.advantage for s in samples] == pytest.approx(want)
    assert sum(1 for i, d in enumerate(credit[0]) for j in d) == 4


def test_fork_settings_are_checked_at_the_boundary() -> None:
    for field, bad in (("fork_turns", 0), ("fork_samples", 0), ("fork_horizon", -1.0)):
        with pytest.raises(ValueError, match=field):
            read_config({field: bad})


def test_a_fork_horizon_past_every_episodes_end_is_refused_before_any_episode(
    tmp_path: Path,
) -> None:
    from collective.rl.train import train
    from tests.support.training import small_train

    cfg = small_train(steps=1, advantage="turn", fork_horizon=60.0)  # (its limit is 60 s)
    with pytest.raises(
        ValueError, match=r"advantage.horizon = 60 s reaches past every episode's end"
    ):
        train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists(), "refused before anything was written"


def test_fork_settings_are_refused_where_they_would_do_nothing() -> None:
    """Under any advantage but "turn" the fork settings are read by nothing: set, they are
    refused (naming them), and a study's run digest leaves them out, so runs made before
    they existed stay valid; under "turn" the digest covers them."""
    from experiments.resumable import train_digest

    with pytest.raises(ValueError, match=r"advantage = 'collective' has no fork_samples = 3"):
        read_config(dict(fork_samples=3))
    assert train_digest(TrainConfig()) == train_digest(read_config(dict(seed=0)))
    turn = read_config(dict(advantage="turn"))
    assert train_digest(turn) != train_digest(read_config(dict(advantage="turn", fork_samples=3)))


def test_a_turn_credit_run_forks_each_rollout_and_reruns_alike(tmp_path: Path) -> None:
    """``advantage = "turn"`` in a real training run: every step forks each rollout's sampled
    turns ``fork_samples`` times (counted in ``fork_rollouts``), and the run, forks included,
    is a function of its config: a rerun writes the same metrics."""
    from collective.records import load_episode
    from collective.rl.rundir import episode_name
    from collective.rl.train import train
    from tests.support.training import comparable_metrics, small_train

    cfg = small_train(steps=2, advantage="turn", fork_turns=2, fork_samples=2, fork_horizon=20.0)
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        train(cfg, run, progress=False)
    metrics = comparable_metrics(runs[0])
    assert metrics == comparable_metrics(runs[1])
    flat = small_train(steps=2)  # the same run with the flat advantage learns otherwise
    train(flat, tmp_path / "flat", progress=False)
    flat_losses = [m["loss"] for m in comparable_metrics(tmp_path / "flat")]
    assert flat_losses != [m["loss"] for m in metrics]
    for m in metrics:  # every rollout's answerable turns, up to fork_turns, times fork_samples
        first = m["step"] * cfg.groups_per_step
        names = [
            runs[0] / "episodes" / episode_name(g, r)
            for g in range(first, first + cfg.groups_per_step)
            for r in range(cfg.group_size)
        ]
        want = 0
        for path in names:
            ep = load_episode(path)
            able = sum(t.policy == "trained" and bool(t.token_ids) for t in ep.turns)
            assert isinstance(cfg.advantage, Turn)
            want += min(able, cfg.advantage.turns) * cfg.advantage.samples
        assert m["fork_rollouts"] == want > 0


def test_turn_credit_is_refused_where_forks_cannot_use_the_right_weights() -> None:
    from collective.rl.checks import validate
    from tests.support.training import small_train

    with pytest.raises(ValueError, match="advantage = 'turn' needs the weights"):
        read_config(
            dict(backend="hf", hf_model="x", hf_server="sglang:http://h:1", advantage="turn")
        )
    with pytest.raises(ValueError, match="org = 'orchestrator'"):
        validate(small_train(advantage="turn", org="orchestrator"))

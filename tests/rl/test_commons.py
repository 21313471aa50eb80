"""Goods that outlive an episode (``commons``): the library world's commons, its versions
across a training run, credit measured by re-running later episodes without an entry, and the
refusals; on the real engine, a scripted player where exact control is needed, and the real
training loop with the tiny model."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import numpy as np
import pytest

from collective import EpisodeConfig, load_episode, run_episodes
from collective.replay import verify
from collective.rl.checks import validate
from collective.rl.commons import CommonsStore, Entry, contributions, step_commons
from collective.rl.config import ClusterConfig, WorldEntry, read_config
from collective.rl.rundir import episode_key
from collective.rl.train import train
from collective.world import Commons
from policy.scripted import LibraryScript, ScriptedPolicy
from tests.support.training import comparable_metrics, small_train
from worlds.library import Library

PUBLISHER = ScriptedPolicy(LibraryScript(publish=True))
_KEYRING = random.Random(0)  # (the library's pool_seed 0 draws each kind's key from it)
KEYS = [_KEYRING.randint(1, 6) for _ in range(12)]


def library(
    seed: int, entries: tuple[str, ...] = (), version: int = 0, **over: float
) -> EpisodeConfig:
    """A library episode of two agents starting from commons ``version`` holding ``entries``."""
    held = msgspec.to_builtins(Commons(version=version, entries=entries))
    ep = EpisodeConfig(
        world="library",
        agents=2,
        world_seed=seed,
        sample_seed=seed,
        time_limit=60.0,
        params={"library": held},
    )
    return msgspec.structs.replace(ep, **over)


def test_a_contribution_is_recorded_with_the_turn_that_made_it_and_replays() -> None:
    eps = run_episodes([library(s) for s in range(6)], PUBLISHER)
    made = [(ep, c) for ep in eps for c in contributions(ep)]
    assert made, "the scripted player publishes every lock it opens"
    for ep, (agent, text, turn) in made:
        kind, key = (int(x) for x in text.split()[1::2])
        assert KEYS[kind] == key  # the entry is the kind's true key
        assert turn >= 0
        t = ep.turns[turn]
        assert (t.agent, t.ok, t.text.split()[0]) == (agent, True, "publish")
    for ep in eps:
        assert verify(ep) is None  # the commons is a parameter: replay starts from it


def test_the_library_opens_what_the_commons_holds() -> None:
    plain = run_episodes([library(s) for s in range(8)], PUBLISHER)
    full = tuple(f"kind {k} key {KEYS[k]}" for k in range(12))
    helped = run_episodes([library(s, full, 3) for s in range(8)], PUBLISHER)
    assert all(ep.score == 1.0 for ep in helped)
    assert np.mean([ep.score for ep in plain]) < 0.8
    assert all(ep.world_metrics["commons_used"] == 3 for ep in helped)


def _store(size: int = 2, lag: int = 1) -> CommonsStore:
    cfg = read_config(
        dict(
            world="library",
            commons="on",
            commons_size=size,
            lag=lag,
            groups_per_step=1,
            group_size=2,
        )
    )
    return CommonsStore(cfg, "library")


def test_versions_hold_what_earlier_steps_made_and_let_the_oldest_go() -> None:
    store = _store(size=2)
    steps = [run_episodes([library(10 * s + i) for i in range(2)], PUBLISHER) for s in range(4)]
    made = [[c[1] for ep in g for c in contributions(ep)] for g in steps]
    assert all(made), "each step's episodes publish"
    history = []
    for s, g in enumerate(steps):
        store.merge(s, [g])
        history.append([e.text for e in store.view(s + 1)])
    assert store.view(0) == []  # version 0: the empty commons the first steps start from
    held: list[str] = []
    for s in range(4):  # what the store must hold: new entries appended, the newest 2 kept
        held = (held + [t for t in dict.fromkeys(made[s]) if t not in held])[-2:]
        assert history[s] == held, s
    # version 3 (one behind) is still there for episodes pinned to it; version 1 is gone
    assert [e.text for e in store.view(3)] == history[2]


def test_credit_is_the_score_an_entry_gives_later_episodes_discounted() -> None:
    """An entry made at step 0 and used at step 2: its credit is exactly the discounted
    difference between the step's episodes and the same episodes re-run without it, and the
    turn that made it is the sample it is paid to."""
    cfg = read_config(
        dict(
            world="library",
            commons="credit",
            commons_size=12,
            commons_credit_entries=1,
            commons_credit_reruns=4,
            commons_discount=0.5,
            groups_per_step=1,
            group_size=4,
            lag=0,
        )
    )
    maker = run_episodes([library(7, time_limit=200.0)], PUBLISHER)
    agent, text, turn = contributions(maker[0])[0]
    kind = int(text.split()[1])
    entry = Entry(text=text, step=0, group=0, member=0, turn=turn, added=1)
    store = CommonsStore(cfg, "library", [entry])
    meets = [s for s in range(200) if kind in Library(2, s).kinds][:4]  # episodes that can use it
    later = run_episodes([store.apply(library(s), 2) for s in meets], PUBLISHER)
    without = run_episodes([store.apply(library(s), 2, without=text) for s in meets], PUBLISHER)
    delta = np.mean([e.score for e in later]) - np.mean([e.score for e in without])
    assert delta > 0, "the later episodes recall the entry"
    samples, m = step_commons(
        cfg, 2, [later], store, lambda v: PUBLISHER, lambda g, i: maker[0] if g == 0 else None
    )
    assert m["commons_rollouts"] == 4 and m["commons_size"] == 1
    assert m["commons_credit"] == pytest.approx(0.5**2 * delta)
    (sample,) = samples
    made = maker[0].turns[turn]
    assert (made.agent, made.text.split()[0]) == (agent, "publish")
    assert sample.tokens == made.token_ids and sample.advantage == pytest.approx(0.25 * delta)


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"world": "tally", "commons": "on"}, "world 'tally' declares no commons"),
        ({"world": "library", "params": {"library": {}}, "commons": "on"}, "params sets 'library'"),
    ],
)
def test_a_commons_the_world_cannot_hold_is_refused(over: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        validate(small_train(**{"params": {}, **over}))


class Misnamed(Library):
    commons = "archive"  # a parameter the constructor does not have


def test_a_commons_parameter_the_world_does_not_take_is_refused() -> None:
    with pytest.raises(ValueError, match="parameter 'archive', which its constructor does not"):
        validate(small_train(world=f"{__name__}:Misnamed", params={}, commons="on"))


def test_credit_that_could_not_be_exact_is_refused() -> None:
    with pytest.raises(ValueError, match="the frozen sub-agents' turns would change"):
        validate(small_train(world="library", params={}, org="orchestrator", commons="credit"))
    with pytest.raises(ValueError, match="which keep_episodes = false deletes"):
        small_train(world="library", params={}, commons="credit", keep_episodes=False)
    with pytest.raises(ValueError, match="sync = 'latest' does not pin them"):
        small_train(world="library", params={}, commons="on", sync="latest")


def test_commons_settings_that_would_do_nothing_are_refused() -> None:
    with pytest.raises(ValueError, match="commons = 'on' has no commons_credit_reruns = 3"):
        small_train(world="library", params={}, commons="on", commons_credit_reruns=3)
    with pytest.raises(ValueError, match="commons = 'off' has no commons_size = 3"):
        small_train(commons_size=3)
    with pytest.raises(ValueError, match="a commons is built for one world"):
        small_train(
            commons="on",
            params={},
            world="workshop",
            cluster=ClusterConfig(backend="ray"),
        )
    with pytest.raises(ValueError, match="a commons is built for one world"):
        read_config(dict(commons="on", worlds=(WorldEntry(world="library"),), mix={}))


@pytest.mark.heavy
def test_a_run_with_a_commons_is_versioned_credited_and_resumes_exactly(tmp_path: Path) -> None:
    """Five steps on the library with credit: every episode starts from the commons of its
    policy version, which holds exactly what the episodes of earlier steps contributed (each new
    entry once, the newest commons_size), each step's metrics count what it added and its credit
    re-runs, and a run stopped and resumed is the uninterrupted run."""
    cfg = small_train(
        world="library",
        params={},
        team_sizes=(3,),
        steps=5,
        time_limit_start=150.0,
        time_limit_end=150.0,
        commons="credit",
        commons_size=4,
        commons_credit_reruns=2,
    )
    train(cfg, tmp_path / "a", progress=False)
    rows = comparable_metrics(tmp_path / "a")
    by_step: dict[int, list] = {}
    for path in sorted((tmp_path / "a" / "episodes").glob("*.msgpack")):
        g = episode_key(path.name)[0]  # type: ignore[index]
        by_step.setdefault(g // cfg.groups_per_step, []).append(load_episode(path))
    views: list[list[str]] = [[]]  # version v's entries, rebuilt from the episode files
    added = []
    for s in range(cfg.steps):
        made = [c[1] for ep in by_step[s] for c in contributions(ep)]
        new = [t for t in dict.fromkeys(made) if t not in views[-1]]
        views.append((views[-1] + new)[-cfg.commons.size :])  # type: ignore[union-attr]
        added.append(len(new))
    assert sum(added) > 0, "the test needs contributions"
    for s in range(cfg.steps):
        for ep in by_step[s]:
            lib = ep.config.params["library"]
            assert lib["version"] == ep.config.policy_version == max(0, s - cfg.lag)
            assert list(lib["entries"]) == views[lib["version"]]
    assert [r["commons_added"] for r in rows] == added
    assert [r["commons_size"] for r in rows] == [len(views[max(0, s - 1)]) for s in range(5)]
    assert sum(r["commons_rollouts"] for r in rows) > 0
    train(cfg, tmp_path / "b", progress=False, stop_after=2)
    train(cfg, tmp_path / "b", progress=False, resume=True)
    assert comparable_metrics(tmp_path / "b") == rows

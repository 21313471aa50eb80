"""Replay, fork and diff, and the episode file as a boundary: identical when nothing changed,
the first divergence named when something did, clear errors for broken files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from collective import (
    EpisodeConfig,
    EpisodeFileError,
    LatencyModel,
    load_episode,
    run_episode,
    save_episode,
)
from collective.records import Committed, Thought, encode_episode
from collective.replay import first_divergence, fork, prefix, replay, verify
from policy.base import PolicyRequest, PolicyResponse
from policy.scripted import ScriptedPolicy
from policy.uniform import RandomPolicy
from tests.support.busy import scaled
from tests.support.episodes import run

CLI = [sys.executable, "-m", "collective.cli"]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env={**os.environ, **(env or {})},
    )


@given(
    agents=st.integers(1, 10),
    seed=st.integers(0, 10**6),
    budget=st.integers(0, 2),
    limit=st.floats(10, 300),
)
def test_replay_reproduces_every_event(agents: int, seed: int, budget: int, limit: float) -> None:
    cfg = EpisodeConfig(
        world="tally",
        agents=agents,
        world_seed=seed,
        sample_seed=seed,
        budget=budget,
        time_limit=limit,
    )
    ep = run_episode(cfg, RandomPolicy())
    again = replay(ep)
    assert first_divergence(ep.events, again.events) is None
    assert encode_episode(again) == encode_episode(ep)


def test_a_tampered_log_is_caught_at_the_first_changed_event() -> None:
    ep = run_episode(EpisodeConfig(world="tally", agents=4, time_limit=200), RandomPolicy())
    # Tamper with a recorded result: the replay recomputes it and disagrees there.
    i = next(i for i, e in enumerate(ep.events) if isinstance(e, Committed) and e.tool == "add")
    forged = list(ep.events)
    forged[i] = msgspec.structs.replace(forged[i], result="count is 999")
    d = verify(msgspec.structs.replace(ep, events=forged))
    assert d is not None and d.index == i and d.expected.result == "count is 999"
    # Tamper with a recorded time: latencies are recomputed, not trusted.
    j = next(i for i, e in enumerate(ep.events) if isinstance(e, Thought))
    forged = list(ep.events)
    forged[j] = msgspec.structs.replace(forged[j], t=forged[j].t + 0.5)
    d = verify(msgspec.structs.replace(ep, events=forged))
    assert d is not None and d.index == j
    # Tamper with a policy output: the world reacts differently from then on.
    turns = list(ep.turns)
    k = next(k for k, t in enumerate(turns) if t.text.startswith("add "))
    turns[k] = msgspec.structs.replace(turns[k], text="wait 0")
    d = verify(msgspec.structs.replace(ep, turns=turns))
    assert d is not None and isinstance(d.expected, Thought) and d.got.text == "wait 0"


def test_hybrid_real_durations_are_charged_logged_and_replayed() -> None:
    ep = run(lambda r: "sleep 5", world="tally", agents=2, clock="hybrid", time_limit=30)
    commits = [e for e in ep.events if isinstance(e, Committed) and e.tool == "sleep"]
    assert commits and all(0.004 < c.real < 1.0 for c in commits), "real work measured"
    begin = {(e.agent, e.act): e for e in ep.events if type(e).__name__ == "Began"}
    for c in commits:
        turn = next(t for t in ep.turns if t.agent == c.agent and t.turn == c.act)
        assert turn.finished == c.t, "the effect lands after the declared duration"
        nxt = next(t for t in ep.turns if t.agent == c.agent and t.turn == c.act + 1)
        assert nxt.asked == c.t + c.real, "the agent is busy for the real duration too"
        assert c.t == begin[(c.agent, c.act)].until
    assert verify(ep) is None, "replay feeds the recorded durations back"


def test_real_clock_episode_runs_on_the_wall_clock_and_replays() -> None:
    ep = run(
        lambda r: "add 1", world="tally", agents=2, clock="real", time_limit=2.5, comm_duration=0.1
    )
    assert ep.end == "time_limit" and ep.duration == 2.5
    assert ep.stats.turns >= 2  # adds take 10 s of wall time, so each agent acts once
    again = replay(ep)
    assert first_divergence(ep.events, again.events) is None


class SlowScript(ScriptedPolicy):
    """Answers after 0.2 s of real time, as a model server would."""

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        await trio.sleep(0.2)
        return await super().generate(requests)


def test_real_clock_answers_replay_at_their_measured_times_even_past_the_end() -> None:
    """Each answer takes 0.2 s of wall time; the latency model would say 0.01 s. The third
    answer is still in flight at T_max (it has a turn but no Thought), yet replay must not
    recompute its time, nor the times of a fork's real-clock prefix."""
    cfg = EpisodeConfig(
        world="tally",
        agents=1,
        clock="real",
        time_limit=0.5,
        comm_duration=0.01,
        latency=LatencyModel(name="fast", prefill_tps=1e9, decode_tps=1e9, overhead=0.01),
    )
    ep = run_episode(cfg, SlowScript(lambda r: 'put "x"'))
    assert ep.end == "time_limit"
    assert ep.turns[-1].answered > cfg.time_limit > ep.turns[-1].asked, "one answer in flight"
    assert verify(ep) is None
    forked = fork(ep, 0.25, SlowScript(lambda r: 'put "x"'))
    assert prefix(forked.events, 0.25) == prefix(ep.events, 0.25)
    assert verify(forked) is None, "a fork of a real-clock episode replays too"


@given(until=st.floats(0, 300), seed=st.integers(0, 1000))
def test_a_fork_shares_the_prefix_exactly(until: float, seed: int) -> None:
    ep = run_episode(
        EpisodeConfig(world="tally", agents=5, time_limit=300, sample_seed=seed), RandomPolicy()
    )
    forked = fork(ep, until, RandomPolicy(), sample_seed=seed + 1)
    assert prefix(forked.events, until) == prefix(ep.events, until)
    assert verify(forked) is None, "a fork is itself an ordinary, replayable episode"


def test_forking_with_the_same_policy_and_seed_changes_nothing() -> None:
    ep = run_episode(EpisodeConfig(world="tally", agents=3, time_limit=200), RandomPolicy())
    assert fork(ep, 50.0, RandomPolicy()).events == ep.events


@pytest.mark.heavy
def test_same_bytes_across_processes_and_hash_seeds(tmp_path: Path) -> None:
    outs = []
    for hashseed in ("0", "1", "random"):
        out = tmp_path / f"ep-{hashseed}.msgpack"
        r = _cli(
            "run",
            "tally",
            "--agents",
            "6",
            "--seed",
            "3",
            "--budget",
            "2",
            "--time-limit",
            "200",
            "--out",
            str(out),
            env={"PYTHONHASHSEED": hashseed},
        )
        assert r.returncode == 0, r.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]


def test_command_line_round_trip(tmp_path: Path) -> None:
    ep = tmp_path / "ep.msgpack"
    r = _cli(
        "run", "tally", "--agents", "4", "--seed", "2", "--time-limit", "120", "--out", str(ep)
    )
    assert r.returncode == 0, r.stderr
    line = json.loads(r.stdout)
    assert set(line) >= {"score", "duration", "events", "turns", "tokens", "messages", "wall_time"}
    assert line["events"] == len(load_episode(ep).events)

    r = _cli("replay", str(ep))
    assert r.returncode == 0 and json.loads(r.stdout)["replay"] == "identical"

    r = _cli("show", str(ep), "--limit", "5")
    assert r.returncode == 0 and "agent 0 starts as worker" in r.stdout

    fork_path = tmp_path / "fork.msgpack"
    r = _cli(
        "replay",
        str(ep),
        "--until",
        "60",
        "--policy",
        "random",
        "--seed",
        "9",
        "--out",
        str(fork_path),
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["forked_at"] == 60

    r = _cli("diff", str(ep), str(fork_path))
    assert r.returncode == 1 and "first divergence at event" in r.stdout
    r = _cli("diff", str(ep), str(ep))
    assert r.returncode == 0 and "identical" in r.stdout


def test_replay_names_the_first_divergence_of_a_tampered_file(tmp_path: Path) -> None:
    ep = run_episode(EpisodeConfig(world="tally", agents=2, time_limit=100), RandomPolicy())
    i = next(i for i, e in enumerate(ep.events) if isinstance(e, Committed))
    events = list(ep.events)
    events[i] = msgspec.structs.replace(events[i], ok=not events[i].ok)
    path = tmp_path / "tampered.msgpack"
    save_episode(msgspec.structs.replace(ep, events=events), path)
    r = _cli("replay", str(path))
    assert r.returncode == 1
    assert f"first divergence at event {i}" in r.stdout


def test_broken_episode_files_give_clear_errors(tmp_path: Path) -> None:
    ep = run_episode(EpisodeConfig(world="tally", agents=2, time_limit=50), RandomPolicy())
    good = encode_episode(ep)
    cases = {
        "truncated": good[: len(good) // 2],
        "corrupt": b"\xc1" + good[1:],
        "empty": b"",
        "not msgpack": b"hello, world\n",
        "wrong shape": msgspec.msgpack.encode({"format": 1, "score": "high"}),
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.msgpack"
        path.write_bytes(data)
        with pytest.raises(EpisodeFileError, match=str(path)):
            load_episode(path)
        r = _cli("replay", str(path))
        assert r.returncode == 2 and str(path) in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(EpisodeFileError, match="cannot read"):
        load_episode(tmp_path / "missing.msgpack")


def test_unknown_world_on_the_command_line_is_one_clear_line() -> None:
    r = _cli("run", "atlantis")
    assert r.returncode == 2 and "unknown world 'atlantis'" in r.stderr
    assert "Traceback" not in r.stderr

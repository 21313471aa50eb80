"""Records that scale: an episode streams to its file in compressed chunks as it runs, and every
reader (load, replay, diff, show, trace) reads it part by part; what was streamed is exactly
what a run held in memory would have written, and a run killed midway leaves nothing that loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from collective import (
    EpisodeConfig,
    EpisodeFileError,
    EpisodeWriter,
    load_episode,
    open_episode,
    run_episode,
    save_episode,
)
from collective.cli import main
from collective.engine import episode as episode_module
from collective.records import encode_episode, fileformat
from collective.replay import audit, differences
from policy.uniform import RandomPolicy
from tests.support.busy import scaled
from tests.support.hostile import as_parts, seal_parts

CFG = EpisodeConfig(world="workshop", agents=6, time_limit=300.0, tokenizer="bytes", sample_seed=4)


class Parts:
    """A recorder that keeps what it is sent, to look at the chunks."""

    def __init__(self) -> None:
        self.parts: list[object] = []

    def write(self, part: object) -> None:
        self.parts.append(msgspec.msgpack.decode(msgspec.msgpack.encode(part)))  # a snapshot


def test_a_streamed_record_is_the_record_a_run_in_memory_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = run_episode(CFG, RandomPolicy())
    monkeypatch.setattr(episode_module, "CHUNK_RECORDS", 64)
    seen = Parts()
    short = run_episode(CFG, RandomPolicy(), recorder=seen)
    chunks = seen.parts[1:-1]
    kinds = [p[0] for p in seen.parts]
    assert kinds[0] == "open" and kinds[-1] == "close" and set(kinds[1:-1]) == {"chunk"}
    assert len(chunks) > 10, "written as it ran, not at the end"
    # Cut between instants, once 64 records gathered: never holding much more than that.
    assert max(max(len(c[1]), len(c[2])) for c in chunks) < 64 + 4 * CFG.agents
    assert short.events == [] and short.turns == [] and short.stats == whole.stats

    path = tmp_path / "ep.msgpack"
    writer = EpisodeWriter(path)
    run_episode(CFG, RandomPolicy(), recorder=writer)
    assert not path.exists(), "put in place only when sealed"
    writer.finish()
    assert encode_episode(load_episode(path)) == encode_episode(whole)
    stream = open_episode(path)
    assert len(stream.offsets) == len(seen.parts)
    assert list(stream.events) == whole.events and len(stream.events) == len(whole.events)
    assert [t.text for t in stream.turns] == [t.text for t in whole.turns]
    assert all(t.kind == "" for t in stream.turns), "turns as answered; outcomes apart"
    assert stream.curve == whole.curve and stream.spaces == whole.spaces
    assert audit(stream)[1] == [] and differences(stream, whole) == []


def test_a_streamed_replay_finds_a_forged_outcome(tmp_path: Path) -> None:
    whole = run_episode(CFG, RandomPolicy())
    d = msgspec.to_builtins(whole)
    world = next(t for t in d["turns"] if t["kind"] == "world" and t["ok"])
    world["result"] = "all done"
    path = tmp_path / "forged.msgpack"
    path.write_bytes(seal_parts(as_parts(d)))
    problems = audit(open_episode(path))[1]
    assert problems and "outcome: result" in problems[0], problems
    assert main(["replay", str(path)]) == 1


def test_the_file_is_at_least_four_times_smaller_than_its_msgpack(tmp_path: Path) -> None:
    ep = run_episode(CFG, RandomPolicy())
    path = tmp_path / "ep.msgpack"
    writer = EpisodeWriter(path)
    run_episode(CFG, RandomPolicy(), recorder=writer)
    writer.finish()
    assert path.stat().st_size * 4 < len(encode_episode(ep))


def test_a_run_killed_midway_leaves_nothing_that_loads(tmp_path: Path) -> None:
    out = tmp_path / "ep.msgpack"
    out.write_bytes(b"an earlier file, kept")
    cmd = [sys.executable, "-m", "collective.cli", "run", "workshop", "--agents", "2000"]
    proc = subprocess.Popen([*cmd, "--time-limit", "3600", "--out", str(out)])
    try:
        deadline = time.monotonic() + scaled(120)
        partial: list[Path] = []
        while time.monotonic() < deadline and proc.poll() is None:
            partial = [p for p in tmp_path.glob(".ep.msgpack.*.tmp") if p.stat().st_size > 4096]
            if partial:
                break
            time.sleep(0.05)
        assert partial, "the run wrote chunks while it ran"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert out.read_bytes() == b"an earlier file, kept", "the old file is untouched"
    with pytest.raises(EpisodeFileError, match="incomplete episode"):
        open_episode(partial[0])
    r = subprocess.run(
        [sys.executable, "-m", "collective.cli", "replay", str(partial[0])],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "incomplete episode" in r.stderr
    assert r.stderr.count("\n") == 1


def test_show_and_diff_read_the_file_as_it_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.msgpack", tmp_path / "b.msgpack"
    for path, seed in ((a, 4), (b, 5)):
        writer = EpisodeWriter(path)
        run_episode(msgspec.structs.replace(CFG, sample_seed=seed), RandomPolicy(), recorder=writer)
        writer.finish()
    assert main(["show", str(a), "--limit", "3"]) == 0
    assert "agent 0 starts as worker" in capsys.readouterr().out
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "config sample_seed: 4 vs 5" in out and "first divergence at event" in out
    assert main(["diff", str(a), str(a)]) == 0


def test_a_whole_episode_saved_in_many_chunks_loads_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ep = run_episode(CFG, RandomPolicy())
    monkeypatch.setattr(fileformat, "CHUNK_RECORDS", 16)  # outcomes land chunks after their turns
    save_episode(ep, tmp_path / "ep.msgpack")
    stream = open_episode(tmp_path / "ep.msgpack")
    assert len(stream.offsets) > 10
    assert load_episode(tmp_path / "ep.msgpack") == ep
    assert differences(stream, ep) == []


def test_top_p_is_recorded_only_when_it_samples_a_nucleus() -> None:
    """``top_p`` 1.0 (the default, or spelled out) leaves the record the bytes it was before
    the field existed, so every recorded episode and golden digest stands; a nucleus is kept
    and read back, and a record without the field reads as 1.0."""
    plain = msgspec.msgpack.encode(EpisodeConfig())
    assert msgspec.msgpack.encode(EpisodeConfig(top_p=1.0)) == plain
    assert b"top_p" not in plain
    old = msgspec.msgpack.decode(plain, type=EpisodeConfig)
    assert old.nucleus == 1.0 and old.top_p is msgspec.UNSET
    kept = msgspec.msgpack.decode(
        msgspec.msgpack.encode(EpisodeConfig(top_p=0.9)), type=EpisodeConfig
    )
    assert kept.top_p == 0.9 == kept.nucleus
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
            EpisodeConfig(top_p=bad)

"""Trust the record: an episode file is verified whole (header, digest, strict decoding), a
consistent forgery is caught by replay, opening an episode runs no code the user did not name,
a policy's answer is bounded, and outputs never replace anything but a regular file."""

from __future__ import annotations

import os
import random
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from collective import (
    Episode,
    EpisodeConfig,
    EpisodeFileError,
    load_episode,
    open_episode,
    run_episode,
    save_episode,
)
from collective.base.actions import longest_action
from collective.base.outputs import OutputError, check_file, write_file
from collective.cli import main
from collective.engine import registry
from collective.records import (
    HEADER_SIZE,
    MAGIC,
    decode_episode,
    encode_episode,
    episode_file_bytes,
)
from collective.replay import audit, differences, replay
from policy.uniform import RandomPolicy
from tests.support import HOSTILE
from tests.support.hostile import as_parts, seal, seal_parts


def _episode(**cfg: Any) -> Episode:
    base: dict[str, Any] = dict(world="workshop", agents=3, time_limit=120, tokenizer="bytes")
    return run_episode(EpisodeConfig(**{**base, **cfg}), RandomPolicy())


EP = _episode()
FILE = episode_file_bytes(EP)


def forged(change: Callable[[dict[str, Any]], None], ep: Episode = EP) -> bytes:
    """``ep`` changed and sealed again, in the layout this version writes."""
    data = msgspec.to_builtins(ep)
    change(data)
    return seal_parts(as_parts(data))


def forged_whole(change: Callable[[dict[str, Any]], None], ep: Episode = EP) -> bytes:
    """The same in the earlier one-body layout, which this version still reads."""
    data = msgspec.to_builtins(ep)
    change(data)
    return seal(msgspec.msgpack.encode(data))


# -- the file: any changed byte is an error ---------------------------------------------------


def test_the_file_is_a_header_then_the_parts() -> None:
    assert FILE.startswith(MAGIC)
    parts = as_parts(msgspec.to_builtins(EP))
    assert seal_parts(parts) == FILE, "the layout is the one documented in records.py"
    assert decode_episode(FILE) == EP
    assert len(FILE) * 4 < len(encode_episode(EP)), "compressed"
    old = seal(encode_episode(EP))  # the earlier layout still reads, as strictly
    assert decode_episode(old) == EP


@given(st.integers(0, len(FILE) - 1), st.integers(1, 255))
def test_every_single_byte_change_is_refused(at: int, xor: int) -> None:
    data = bytearray(FILE)
    data[at] ^= xor
    with pytest.raises(EpisodeFileError):
        decode_episode(bytes(data))


def test_every_header_byte_and_every_cut_is_refused() -> None:
    for at in range(HEADER_SIZE):
        data = bytearray(FILE)
        data[at] ^= 0x01
        with pytest.raises(EpisodeFileError):
            decode_episode(bytes(data))
    for n in (0, 1, HEADER_SIZE - 1, HEADER_SIZE, len(FILE) // 2, len(FILE) - 1):
        with pytest.raises(EpisodeFileError):
            decode_episode(FILE[:n])
    with pytest.raises(EpisodeFileError, match="bytes added"):
        decode_episode(FILE + b"\0")


@pytest.mark.parametrize(
    "where",
    [
        "episode",
        "config",
        "stats",
        "turn",
        "event",
        "space",
        "latency",
        "renamed format",
        "renamed space",
    ],
)
def test_a_sealed_file_with_a_field_this_version_does_not_know_is_refused(where: str) -> None:
    def change(d: dict[str, Any]) -> None:
        if where == "episode":
            d["extra"] = 1
        elif where == "config":
            d["config"]["extra"] = 1
        elif where == "stats":
            d["stats"]["extra"] = 1
        elif where == "turn":
            d["turns"][0]["extra"] = 1
        elif where == "event":
            d["events"][0].append(1)
        elif where == "space":
            d["spaces"][0]["tools"][0]["extra"] = 1
        elif where == "latency":
            d["config"]["latency"]["extra"] = 1
        elif where == "renamed format":
            d["formbt"] = d.pop("format")
        else:
            d["turns"][0]["spacf"] = d["turns"][0].pop("space")

    unknown = r"unknown field|Expected `array` of at most length"
    with pytest.raises(EpisodeFileError, match=unknown):
        decode_episode(forged_whole(change))
    if where not in ("episode", "renamed format"):  # top-level fields the parts do not have
        with pytest.raises(EpisodeFileError, match=unknown):
            decode_episode(forged(change))


@pytest.mark.parametrize("where", ["opening", "chunk", "closing", "turn end"])
def test_a_part_with_more_than_this_version_knows_is_refused(where: str) -> None:
    parts = as_parts(msgspec.to_builtins(EP))
    opening, chunk, closing = parts
    {"opening": opening, "chunk": chunk, "closing": closing, "turn end": chunk[3][0]}[where].append(
        1
    )
    with pytest.raises(EpisodeFileError, match="Expected `array` of at most length"):
        decode_episode(seal_parts(parts))


def test_parts_out_of_place_are_refused() -> None:
    opening, chunk, closing = as_parts(msgspec.to_builtins(EP))
    for parts in ([chunk, closing], [opening, chunk], [opening, closing, chunk], [opening]):
        with pytest.raises(EpisodeFileError, match="not a valid episode body"):
            decode_episode(seal_parts(parts))
    chunk[3].append(chunk[3][0])  # a turn ended twice
    with pytest.raises(EpisodeFileError, match="ends twice"):
        decode_episode(seal_parts([opening, chunk, closing]))


def test_a_format_1_file_is_refused_with_the_reason() -> None:
    old = msgspec.to_builtins(EP)
    old["format"] = 1
    del old["config"]["tokenizer"]
    with pytest.raises(EpisodeFileError, match="format 1"):
        decode_episode(msgspec.msgpack.encode(old))


# -- replay: a consistent forgery is caught ---------------------------------------------------


def _first(d: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(t for t in d["turns"] if t["kind"] == kind and t["ok"])


FORGERIES: dict[str, Callable[[dict[str, Any]], None]] = {
    "a turn's result": lambda d: _first(d, "world").update(result="done, all of it"),
    "a turn's token ids": lambda d: _first(d, "world").update(
        token_ids=[x ^ 1 for x in _first(d, "world")["token_ids"]]
    ),
    "a turn's prompt": lambda d: d["turns"][3].update(prompt=d["turns"][3]["prompt"] + " "),
    "a turn's finish time": lambda d: _first(d, "world").update(finished=1.5),
    "a turn's version": lambda d: d["turns"][0].update(version=7),
    "a positive logprob": lambda d: d["turns"][0]["logprobs"].__setitem__(0, 0.5),
    "a missing logprob": lambda d: d["turns"][0]["logprobs"].pop(),
    "a duplicated turn": lambda d: d["turns"].append(d["turns"][0]),
    "the score": lambda d: d.update(score=1.0),
    "the end": lambda d: d.update(end="done"),
    "the stats": lambda d: d["stats"].update(world_tokens=d["stats"]["world_tokens"] + 1),
    "the curve": lambda d: d["curve"].append([119.0, 1.0]),
    "the world's metrics": lambda d: d["world_metrics"].update(duplicates=0.0),
    "an action space": lambda d: d["spaces"][0]["tools"][0].update(doc="anything"),
}


@pytest.mark.parametrize("what", sorted(FORGERIES))
def test_replay_catches_a_consistent_forgery_of(what: str, tmp_path: Path) -> None:
    assert audit(EP)[1] == [], "the genuine record holds"
    data = forged(FORGERIES[what])
    ep = decode_episode(data)  # a valid file: the digest matches
    _, problems = audit(ep)
    assert problems, f"forging {what} went unnoticed"
    (tmp_path / "ep.msgpack").write_bytes(data)  # and replayed from the file as it is read
    assert audit(open_episode(tmp_path / "ep.msgpack"))[1], f"streamed: {what} went unnoticed"


def test_recomputing_the_answers_catches_forged_logprobs() -> None:
    ep = decode_episode(forged(lambda d: d["turns"][2]["logprobs"].__setitem__(0, -0.25)))
    assert audit(ep)[1] == [], "the record alone cannot tell a plausible logprob"
    _, problems = audit(ep, policy=RandomPolicy())
    assert any("logprobs" in p for p in problems), problems
    assert audit(EP, policy=RandomPolicy())[1] == [], "the genuine answers recompute exactly"


def test_diff_compares_config_events_and_turns_and_tells_times_apart(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a, b = tmp_path / "a.msgpack", tmp_path / "b.msgpack"
    save_episode(EP, a)
    save_episode(
        msgspec.structs.replace(EP, config=msgspec.structs.replace(EP.config, policy="x")), b
    )
    assert main(["diff", str(a), str(b)]) == 1
    assert "config policy" in capsys.readouterr().out
    # Hybrid-clock times a hair apart: both shown, and shown differently.
    ep = _episode(clock="hybrid", world="tally", time_limit=60)
    events = list(ep.events)
    i = next(i for i, e in enumerate(events) if type(e).__name__ == "Thought")
    events[i] = msgspec.structs.replace(events[i], t=events[i].t + 1e-9)
    save_episode(ep, a)
    save_episode(msgspec.structs.replace(ep, events=events), b)
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert f"(t={ep.events[i].t!r} vs {events[i].t!r})" in out
    assert repr(ep.events[i].t) != repr(events[i].t)
    assert main(["diff", str(a), str(a)]) == 0
    assert differences(ep, replay(ep), config=False) == []


# -- opening an episode runs no code the user did not name ------------------------------------


def test_replaying_a_file_world_needs_the_user_to_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A copy of the world under a fresh name, recorded, then forgotten by this process.
    world = tmp_path / "their_world.py"
    world.write_text(HOSTILE.read_text())
    path = tmp_path / "ep.msgpack"
    save_episode(_episode(world=f"{world}:Counter", time_limit=60), path)
    registry._loaded.clear()
    for name in [n for n in sys.modules if n.startswith("_collective_world_")]:
        del sys.modules[name]
    marker = tmp_path / "imported"
    monkeypatch.setenv("COLLECTIVE_TEST_MARKER", str(marker))
    for argv in (
        ["replay", str(path)],
        ["replay", str(path), "--until", "10"],
        ["show", str(path), "--limit", "3"],
        ["diff", str(path), str(path)],
    ):
        code = main(argv)
        assert not marker.exists(), f"{argv[0]} imported the episode's world"
        if argv[0] == "replay":
            assert code == 2
            err = capsys.readouterr().err
            assert "not built in" in err and f"--world {world}:Counter" in err
            assert err.count("\n") == 1
    assert main(["replay", str(path), "--world", f"{world}:Counter"]) == 0
    assert marker.exists(), "named by the user: imported and replayed"


# -- a policy's answer is bounded -------------------------------------------------------------


@pytest.mark.parametrize(("chars", "tokens"), [(10_000_000, 3), (5, 100_000)])
def test_an_answer_past_its_bound_is_invalid_and_kept_only_to_the_bound(
    chars: int, tokens: int, tmp_path: Path
) -> None:
    from tests.support.hostile import Flood

    cfg = EpisodeConfig(world="tally", agents=2, time_limit=30, max_output_tokens=64)
    ep = run_episode(cfg, Flood(chars, tokens))
    assert ep.turns and all(t.kind == "invalid" for t in ep.turns if t.kind)
    longest = max(longest_action(s) for s in ep.spaces)
    assert all(len(t.text) <= longest + 1 and len(t.token_ids) <= 65 for t in ep.turns)
    assert ep.stats.actions == 0 and ep.stats.rejected > 0
    save_episode(ep, tmp_path / "ep.msgpack")
    assert (tmp_path / "ep.msgpack").stat().st_size < 100_000
    assert audit(load_episode(tmp_path / "ep.msgpack"))[1] == [], "and it replays"


# -- outputs ----------------------------------------------------------------------------------


def test_outputs_replace_only_regular_files(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    (tmp_path / "to_folder").symlink_to(folder)
    (tmp_path / "to_nothing").symlink_to(tmp_path / "nothing")
    for bad in (fifo, folder, tmp_path / "to_folder", tmp_path / "to_nothing", Path("/dev/null")):
        before = os.lstat(bad)
        with pytest.raises(OutputError):
            check_file(bad)
        with pytest.raises(OutputError):
            write_file(bad, b"x")
        after = os.lstat(bad)
        assert (stat.S_IFMT(after.st_mode), after.st_ino) == (
            stat.S_IFMT(before.st_mode),
            before.st_ino,
        ), f"{bad} was replaced"
    target = tmp_path / "real.bin"
    target.write_bytes(b"old")
    (tmp_path / "link.bin").symlink_to(target)
    assert write_file(tmp_path / "link.bin", b"new") == target
    assert (tmp_path / "link.bin").is_symlink() and target.read_bytes() == b"new"
    assert write_file(tmp_path / "a" / "b" / "c.bin", b"deep").read_bytes() == b"deep"
    assert sorted(p.name for p in tmp_path.rglob(".*")) == [], "no temporary file left"


def test_a_random_sample_of_flips_via_the_command_line_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(12)
    for k in range(5):
        data = bytearray(FILE)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path = tmp_path / f"flip{k}.msgpack"
        path.write_bytes(bytes(data))
        assert main(["replay", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err

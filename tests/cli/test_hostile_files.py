"""Files and file systems as an adversary (or bad luck) gives them, against the real command
line in subprocesses: an input that is a FIFO or a device must be refused, not waited on; an
output on a full disk, a read-only mount or past a file size limit is one line, exit 2, the old
file kept and no temporary left; a replay is bounded by its record, not by the limits the
record declares; what is printed cannot take over the terminal. And, open-ended: records that
the whole loader refuses, digests recomputed, are refused by every reader (hypothesis).

The disk cases mount small tmpfs file systems, which needs root (or CAP_SYS_ADMIN); where that
is not allowed they are skipped, and the file size limit case (``RLIMIT_FSIZE``, any user)
still covers the write-error path.
"""

from __future__ import annotations

import itertools
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collective import EpisodeConfig, run_episode
from collective.cli import main
from collective.records import EpisodeFileError, episode_file_bytes, episode_parts, load_episode
from policy.uniform import RandomPolicy
from tests.support.busy import scaled
from tests.support.hostile import seal_parts
from tests.support.training import SMALL_TOML

CLI = [sys.executable, "-m", "collective.cli"]
EPISODE = run_episode(
    EpisodeConfig(world="workshop", agents=3, time_limit=120, tokenizer="bytes"), RandomPolicy()
)
ONE_STEP_TOML = SMALL_TOML.replace("steps = 2", "steps = 1")


def cli(*args: str, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),  # quiet seconds, as long as the load makes them
        **kw,  # type: ignore[arg-type]
    )


def refused(done: subprocess.CompletedProcess[str], fragment: str) -> None:
    """Exit 2, one line on stderr holding ``fragment``, no traceback."""
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-500:])
    assert fragment in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("files")
    p = {"tmp": tmp, "episode": tmp / "ep.msgpack", "fifo": tmp / "fifo", "toml": tmp / "s.toml"}
    p["episode"].write_bytes(episode_file_bytes(EPISODE))
    os.mkfifo(p["fifo"])
    p["toml"].write_text(ONE_STEP_TOML)
    # A run whose training state is a FIFO, for --resume.
    p["run_state"] = tmp / "run_state"
    (p["run_state"] / "checkpoints").mkdir(parents=True)
    (p["run_state"] / "config.toml").write_text(ONE_STEP_TOML)
    os.mkfifo(p["run_state"] / "checkpoints" / "train-state.pt")
    p["run"] = tmp / "run"  # a finished run, to plot
    done = cli("train", str(p["toml"]), "--out", str(p["run"]), "--quiet", timeout=300)
    assert done.returncode == 0, done.stderr
    return p


# -- nothing hangs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["show", "{fifo}"], "is a FIFO; only a regular file is read"),
        (["show", "{fifo}", "--png", "{tmp}/x.png"], "is a FIFO"),
        (["replay", "{fifo}"], "is a FIFO"),
        (["replay", "{fifo}", "--until", "5"], "is a FIFO"),
        (["trace", "{fifo}", "--out", "{tmp}/t.json"], "is a FIFO"),
        (["diff", "{episode}", "{fifo}"], "is a FIFO"),
        (["diff", "{fifo}", "{episode}"], "is a FIFO"),
        (["show", "/dev/zero"], "/dev/zero is a device"),
        (["train", "{fifo}", "--out", "{tmp}/never"], "config: "),
        (["train", "--resume", "{run_state}", "--quiet"], "train-state.pt is a FIFO"),
        (["run", "tally", "--policy", "tiny:{fifo}"], "checkpoint: "),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_fifo_or_device_as_input_is_refused_not_waited_on(
    argv: list[str], fragment: str, files: dict[str, Path]
) -> None:
    done = cli(*(a.format(**files) for a in argv), timeout=60)  # a hang fails here
    refused(done, fragment)


def test_a_replay_is_bounded_by_its_record_not_by_the_limits_it_declares(tmp_path: Path) -> None:
    """A genuine episode with time_limit=1e308 and max_events=2**63-1 written into its config
    and its digest recomputed: the replay stops one event past the record (the genuine file's
    replay takes a fraction of a second) and says how the file is not what ran."""
    data = msgspec.to_builtins(EPISODE)
    data["config"].update(time_limit=1e308, max_events=2**63 - 1)
    forged = tmp_path / "forged.msgpack"
    forged.write_bytes(episode_file_bytes(msgspec.convert(data, type=type(EPISODE))))
    done = cli("replay", str(forged), timeout=60)
    assert done.returncode == 1, done.stderr
    assert "end: 'time_limit' vs 'replay_bound' (the replay went past the record's " in done.stdout
    assert "event_limit" not in done.stdout


# -- outputs on file systems that cannot take them ------------------------------------------


@pytest.fixture
def mounts(tmp_path: Path, files: dict[str, Path]) -> Iterator[dict[str, Path]]:
    """A 64 KiB tmpfs (full after a few episodes' worth) and a read-only one, each holding an
    old ``ep.msgpack`` and a run's metrics; skipped where mounting is not allowed."""
    made: list[Path] = []
    try:
        for name, options in (("full", "size=64k"), ("ro", "size=64k")):
            point = tmp_path / name
            point.mkdir()
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True
            )
            if done.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
            made.append(point)
            (point / "ep.msgpack").write_text("old\n")
            (point / "run").mkdir()
            shutil.copy(files["run"] / "metrics.jsonl", point / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(made[1])], check=True)
        yield {"full": made[0], "ro": made[1], "tmp": tmp_path}
    finally:
        for point in made:
            subprocess.run(["umount", str(point)], check=False)


def kept_and_clean(folder: Path) -> None:
    assert (folder / "ep.msgpack").read_text() == "old\n", "the old file is kept"
    left = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    assert left == [], f"temporaries left: {left}"


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["run", "workshop", "--agents", "20", "--out", "{full}/ep.msgpack"], "No space left"),
        (["replay", "{big}", "--until", "5", "--out", "{full}/ep.msgpack"], "No space left"),
        (["trace", "{big}", "--out", "{full}/ep.msgpack"], "No space left on device"),
        (["run", "tally", "--out", "{ro}/ep.msgpack"], "Read-only file system"),
        (["trace", "{episode}", "--out", "{ro}/ep.msgpack"], "Read-only file system"),
        (["show", "{episode}", "--png", "{ro}/ep.msgpack"], "Read-only file system"),
        (["train", "{toml}", "--out", "{ro}/run", "--quiet"], "Read-only file system"),
        (["make-model", "tiny-lm", "{ro}/model"], "Read-only file system"),
        (["plot", "{ro}/run"], "Read-only file system"),
        (["study", "scale", "", "--agents", "1", "--out", "{ro}/s", "--quiet"], "Read-only"),
    ],
    ids=lambda v: (
        " ".join(v[:2]) + (" (full)" if "{full}" in " ".join(v) else " (ro)")
        if isinstance(v, list)
        else None
    ),
)
def test_an_output_the_disk_cannot_take_is_one_line_and_the_old_file_stays(
    argv: list[str], fragment: str, mounts: dict[str, Path], files: dict[str, Path]
) -> None:
    big = mounts["tmp"] / "big.msgpack"  # an episode whose trace is larger than the disk
    if not big.exists():
        cfg = EpisodeConfig(world="workshop", agents=40, time_limit=300, tokenizer="bytes")
        big.write_bytes(episode_file_bytes(run_episode(cfg, RandomPolicy())))
    names = {**files, **mounts, "big": big}
    done = cli(*(a.format(**names) for a in argv), timeout=300)
    refused(done, fragment)
    for folder in (mounts["full"], mounts["ro"]):
        kept_and_clean(folder)


@pytest.mark.heavy
def test_a_full_disk_during_training_is_one_line(mounts: dict[str, Path], files: dict) -> None:
    """Checkpoints are torch.save'd: serialised in memory first, so a full disk is the system's
    one-line error (and no half checkpoint), not torch's wrapped RuntimeError."""
    subprocess.run(["mount", "-o", "remount,size=200k", str(mounts["full"])], check=True)
    done = cli("train", str(files["toml"]), "--out", str(mounts["full"] / "new"), "--quiet")
    refused(done, "No space left on device")
    assert not list((mounts["full"] / "new").rglob(".*")), "no temporary left"


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead


def test_a_write_past_the_file_size_limit_is_one_line(files: dict[str, Path]) -> None:
    """The write-error path without root: RLIMIT_FSIZE makes a write fail (EFBIG), as a full
    disk does (ENOSPC)."""
    out = files["tmp"] / "limited" / "ep.msgpack"
    out.parent.mkdir()
    out.write_text("old\n")
    done = cli("run", "workshop", "--agents", "20", "--out", str(out), preexec_fn=_limit_file_size)
    refused(done, f"--out: cannot write {out} (File too large) (the old file is kept)")
    kept_and_clean(out.parent)


# -- what is printed cannot take over the terminal --------------------------------------------

EVIL = "\x1b]0;pwned\x07\x1b[2J\u202e"


def test_agent_text_and_file_content_print_escaped(tmp_path: Path) -> None:
    data = msgspec.to_builtins(EPISODE)
    data["config"]["policy"] = EVIL
    for e in data["events"]:
        if e[0] == "think":
            e[5] = f"say {EVIL}"
        elif e[0] == "commit":
            e[6] = f"saved {EVIL}"
    data["turns"][0].update(prompt=f"line one\n{EVIL}\nline three", result=EVIL)
    evil = tmp_path / "evil.msgpack"
    evil.write_bytes(episode_file_bytes(msgspec.convert(data, type=type(EPISODE))))
    good = tmp_path / "good.msgpack"
    good.write_bytes(episode_file_bytes(EPISODE))
    escaped = "\\x1b]0;pwned\\x07\\x1b[2J\\u202e"
    for argv in (
        ["show", str(evil)],
        ["show", str(evil), "--all", "--agent", "0"],
        ["show", str(evil), "--observations"],
        ["diff", str(evil), str(good)],
        ["replay", str(evil)],
    ):
        done = cli(*argv)
        text = done.stdout + done.stderr
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, argv
        assert escaped in text, (argv, text[:2000])
        assert "Traceback" not in text
    lines = cli("show", str(evil), "--observations").stdout.splitlines()
    assert lines[1].endswith("sees:") and lines[2].endswith("| line one"), lines[:5]
    assert lines[3].endswith(f"| {escaped}") and lines[4].endswith("| line three"), lines[:5]


def test_a_world_error_prints_escaped_in_check_and_run(tmp_path: Path) -> None:
    world = tmp_path / "evil.py"
    world.write_text(
        "from collective.world import World, tool\n\n"
        "class Evil(World):\n"
        "    @tool(duration=1.0)\n"
        "    def go(self, agent: int) -> str:\n"
        f"        raise RuntimeError({EVIL!r})\n\n"
        "    def observe(self, agent: int) -> str:\n        return 'go'\n\n"
        "    def score(self) -> float:\n        return 0.0\n"
    )
    ref = f"{world}:Evil"
    quick = ["--agents", "2", "--seeds", "1", "--rollouts", "2", "--time-limit", "60"]
    for argv, code in ((["check", ref, *quick], 2), (["run", ref], 2)):  # a world error: 2
        done = cli(*argv)
        text = done.stdout + done.stderr
        assert done.returncode == code, text
        assert "\x1b" not in text and "\u202e" not in text, argv
        assert "RuntimeError: \\x1b]0;pwned\\x07" in text, text


# -- records the loader refuses, against every reader (hypothesis) ----------------------------

PARTS = [msgspec.to_builtins(p) for p in episode_parts(EPISODE)]


def _spawned(chunk: list) -> int:
    return sum(1 for e in chunk[1] if e[0] == "spawn")


@st.composite
def broken_records(draw: st.DrawFn) -> list:
    """The episode's parts, its one chunk cut into several at random places, then changed in
    one of the ways the loader refuses: digests recomputed by ``seal_parts``."""
    opening, chunk, closing = (msgspec.convert(p, type=list) for p in PARTS)
    chunk = msgspec.json.decode(msgspec.json.encode(chunk))  # a deep copy
    closing = list(closing)
    events, turns, ends = chunk[1], chunk[2], chunk[3]
    kind = draw(
        st.sampled_from(
            [
                "outcome on a turn",
                "end twice",
                "end out of range",
                "end before its turn",
                "event of an unborn agent",
                "event of a negative agent",
                "delivery to nobody",
                "turn of an unborn agent",
                "closing counts",
                "turn space out of range",
                "turn text too long",
            ]
        )
    )
    n = _spawned(chunk)
    k = draw(st.integers(2 if kind == "end before its turn" else 1, 4))
    early = None  # the end to write before its turn
    if kind == "end before its turn":
        first = draw(st.integers(0, len(turns) - 1))  # the turns the first chunk holds
        late = [e for e in ends if e[0] >= first]
        early = draw(st.sampled_from(late)) if late else [first, "add", "world", True, "", 1.0]
        if not late:
            ends.append(early)
    if kind == "outcome on a turn":
        draw(st.sampled_from(turns)).update(kind="world", ok=True, result="x")
    elif kind == "end twice":
        ends.insert(draw(st.integers(0, len(ends))), draw(st.sampled_from(ends)))
    elif kind == "end out of range":
        draw(st.sampled_from(ends))[0] = draw(st.integers(len(turns), 10**12) | st.integers(-9, -1))
    elif kind == "event of an unborn agent":
        e = draw(st.sampled_from([e for e in events if e[0] != "spawn" and e[2] >= 0]))
        e[2] = draw(st.integers(n, 2**40))
    elif kind == "event of a negative agent":
        draw(st.sampled_from(events))[2] = draw(st.integers(-(2**40), -2))
    elif kind == "delivery to nobody":
        draw(st.sampled_from([e for e in events if e[0] == "deliver"]))[4] = draw(
            st.integers(n, 10**9)
        )
    elif kind == "turn of an unborn agent":
        draw(st.sampled_from(turns))["agent"] = draw(st.integers(n, 10**9))
    elif kind == "closing counts":
        i = draw(st.sampled_from([4, 6]))  # stats (events), turns
        if i == 6:
            closing[6] += draw(st.integers(1, 10**9) | st.integers(-closing[6], -1))
        else:
            closing[4]["events"] += draw(st.integers(1, 10**9))
    elif kind == "turn space out of range":
        draw(st.sampled_from(turns))["space"] = draw(st.integers(len(chunk[4]), 10**6))
    elif kind == "turn text too long":
        draw(st.sampled_from(turns))["text"] = "x" * draw(st.integers(2000, 20000))
    # Cut into chunks: events and turns each at their own places, every end in the chunk
    # that writes its turn or a later one (but the one written early, if that is the change).
    cuts = {
        name: sorted(draw(st.lists(st.integers(0, len(xs)), min_size=k - 1, max_size=k - 1)))
        for name, xs in (("events", events), ("turns", turns))
    }
    if early is not None:
        cuts["turns"] = [first, *(max(c, first) for c in cuts["turns"][1:])]

    def pieces(xs: list, at: list[int]) -> list[list]:
        bounds = [0, *at, len(xs)]
        return [xs[a:b] for a, b in itertools.pairwise(bounds)]

    ev, tu = pieces(events, cuts["events"]), pieces(turns, cuts["turns"])
    written = [sum(len(t) for t in tu[: i + 1]) for i in range(k)]
    en: list[list] = [[] for _ in range(k)]
    for e in ends:
        home = next((i for i in range(k) if 0 <= e[0] < written[i]), k - 1)
        en[0 if e is early else draw(st.integers(home, k - 1))].append(e)
    chunks = [
        ["chunk", ev[i], tu[i], en[i], chunk[4] if i == 0 else [], chunk[5] if i == 0 else []]
        for i in range(k)
    ]
    return [opening, *chunks, closing]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=broken_records())
def test_every_reader_refuses_what_the_loader_refuses(
    parts: list, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.msgpack"
    path.write_bytes(seal_parts(parts))
    with pytest.raises(EpisodeFileError, match="not a valid episode body"):
        load_episode(path)
    good = tmp_path / "good.msgpack"
    if not good.exists():
        good.write_bytes(episode_file_bytes(EPISODE))
    for argv in (
        ["show", str(path)],
        ["show", str(path), "--observations"],
        ["trace", str(path), "--out", str(tmp_path / "t.json")],
        ["diff", str(good), str(path)],
        ["replay", str(path)],
    ):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "not a valid episode body" in err, (argv, code, err)
        assert err.count("\n") == 1
    assert not (tmp_path / "t.json").exists()

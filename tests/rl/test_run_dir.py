"""A run directory belongs to one process and one config: the lock every ``train`` takes on it
(``RunDir.lock``), and the config record a resume is checked against (``config.json``; only
``--set steps=N`` may extend a run, logged in ``resumes.jsonl``)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from collective.cli import main
from collective.rl.rundir import LOCK, RunDir
from collective.rl.train import load_config, read_metrics, train
from tests.support.busy import scaled
from tests.support.training import comparable_metrics, small_train

CLI = [sys.executable, "-m", "collective.cli"]


def _tree(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}


@pytest.mark.heavy
def test_a_second_train_is_refused_naming_the_holder_and_kill_9_leaves_no_stale_lock(
    tmp_path: Path,
) -> None:
    """A real ``train --out R`` is stopped (SIGSTOP) mid-run, holding R: a second ``train
    --out R`` and a ``--resume R`` each exit 2 in one line naming its pid, and R is byte for
    byte as it was. Then the holder is killed with SIGKILL (no cleanup runs): ``--resume R``
    takes the lock the kernel released and finishes the run."""
    config = tmp_path / "small.toml"
    config.write_text(
        "world = 'tally'\nparams = {target = 12}\nteam_sizes = [1, 3]\nsteps = 6\n"
        "groups_per_step = 2\ngroup_size = 3\ntime_limit_start = 60.0\ntime_limit_end = 60.0\n"
        "concurrency = 6\nmax_output_tokens = 12\nplots = false\n"
        "[model]\nd_model = 32\nn_layers = 1\nn_heads = 2\nd_ff = 64\ncontext = 96\n"
    )
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [*CLI, "train", str(config), "--out", str(run), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        metrics = run / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_bytes().count(b"\n") >= 1):
            assert holder.poll() is None and time.monotonic() < deadline, "it ended too soon"
            time.sleep(0.05)
        holder.send_signal(signal.SIGSTOP)
        time.sleep(0.2)  # (a write in hand when it stopped has landed or not: R is still)
        before = _tree(run)
        assert len(read_metrics(run)) < 6, "the run ended before it could be stopped"
        for argv, told in (
            # (a new run on a folder holding steps is refused for that, before any lock)
            (["train", str(config), "--out", str(run)], "already holds a run"),
            (["train", "--resume", str(run)], f"is in use: process {holder.pid} is training"),
            (["train", "--resume", str(run), "--set", "steps=8"], f"process {holder.pid}"),
        ):
            second = subprocess.run(
                [*CLI, *argv, "--quiet"], capture_output=True, text=True, timeout=scaled(120)
            )
            assert second.returncode == 2, second.stderr
            assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
            assert told in second.stderr, second.stderr
            assert _tree(run) == before, f"{argv} changed the run directory"
        holder.kill()  # kill -9, while stopped: nothing of it runs again
        assert holder.wait(30) == -signal.SIGKILL
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
    done = subprocess.run(
        [*CLI, "train", "--resume", str(run), "--quiet"],
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"] == 6
    named = [
        n for ln in (run / "ledger.jsonl").read_text().splitlines() for n in json.loads(ln)["used"]
    ]
    assert len(named) == len(set(named)) == 6 * 2 * 3, "every episode used once"


def test_a_resume_is_refused_while_another_process_resumes(tmp_path: Path) -> None:
    """The lock is the kernel's: held by a real other process (here one holding
    ``RunDir.lock`` and waiting), a resume in this one is refused naming it."""
    run = tmp_path / "run"
    train(small_train(steps=2), run, progress=False, stop_after=1)
    code = (
        "import sys, time\n"
        "from collective.rl.rundir import RunDir\n"
        "from collective.rl.train import load_config\n"
        f"run = {str(run)!r}\n"
        "with RunDir(run, load_config(run + '/config.toml')).lock(resume=True):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        with pytest.raises(ValueError, match=rf"is in use: process {other.pid} is training"):
            train(small_train(steps=2), run, resume=True, progress=False)
        assert len(read_metrics(run)) == 1
    finally:
        other.communicate("\n", timeout=scaled(30))
    assert len(train(small_train(steps=2), run, resume=True, progress=False)) == 1  # released


def test_only_one_of_many_racing_starts_holds_the_folder_and_failed_starts_leave_nothing(
    tmp_path: Path,
) -> None:
    """Eight starts race for one new run directory, 1600 times between them; each that gets it
    fails (as a start with a bad config would) and so removes what it made, under its lock. No
    two ever hold it at once (a start refused is refused in one line, a ValueError), and the
    one holding it always holds the lock file that is there (a start that opened the lock file
    just before another's cleanup removed it must not think it holds the folder). Threads, but
    each its own open file: flock's exclusion is per open file, the same between threads as
    between processes."""
    run = tmp_path / "deep" / "run"
    inside: list[int] = []
    problems: list[str] = []
    held = refused = 0
    in_use: list[bool] = []
    count = threading.Lock()

    class Failed(Exception):
        pass

    def racer() -> None:
        nonlocal held, refused
        for _ in range(1600 // 8):
            try:
                with RunDir(run, small_train()).lock(resume=False):
                    inside.append(1)
                    if len(inside) > 1:
                        problems.append("two holders at once")
                    if not (run / LOCK).exists():
                        problems.append("the holder's lock file is gone")
                    with count:
                        held += 1
                    time.sleep(0)
                    inside.pop()
                    raise Failed
            except Failed:
                pass
            except ValueError as e:  # one line from the command line, whatever it says
                in_use.append("is in use" in str(e))
                with count:
                    refused += 1

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    assert held >= 8 and held + refused == 8 * (1600 // 8)
    # Most refusals name the holder; a start that looks as a failed one removes the folder
    # gets another one line (the folder changed as it was checked, or vanished as it was made).
    assert sum(in_use) > len(in_use) / 2, (sum(in_use), len(in_use))
    # Nothing is left but, at most, empty folders: one a refused start made (it changes
    # nothing once refused) is, to the holder, an empty folder that was there before it.
    left = list((tmp_path / "deep").rglob("*"))
    assert all(p.is_dir() for p in left), f"a failed start left files behind: {left}"


def test_steps_may_grow_on_resume_and_the_run_is_the_longer_run(tmp_path: Path) -> None:
    """``--resume R --set steps=N`` extends a finished run: logged in resumes.jsonl and in
    config.toml (a later resume continues it as it is now), and the run is the run that had
    N steps from the start, metrics and episode files alike. Shortening, or any other field,
    is refused; so is editing config.toml by hand, steps included."""
    run, whole = tmp_path / "run", tmp_path / "whole"
    train(small_train(steps=2), run, progress=False)
    assert main(["train", "--resume", str(run), "--set", "steps=3", "--quiet"]) == 0
    train(small_train(steps=3), whole, progress=False)
    assert comparable_metrics(run) == comparable_metrics(whole)
    names = sorted(p.name for p in (whole / "episodes").glob("*.msgpack"))
    assert len(names) == 3 * 2 * 3
    for name in names:
        assert (run / "episodes" / name).read_bytes() == (whole / "episodes" / name).read_bytes()
    changes = [json.loads(ln) for ln in (run / "resumes.jsonl").read_text().splitlines()]
    assert changes == [{"step": 2, "steps": 3, "was": 2}]
    assert load_config(run / "config.toml") == small_train(steps=3)
    assert train(small_train(steps=3), run, resume=True, progress=False) == []  # complete as it is
    with pytest.raises(ValueError, match="may extend a run, not shorten it"):
        train(small_train(steps=2), run, resume=True, progress=False)
    with pytest.raises(ValueError, match=r"may change only steps .*, not clip 0.2 -> 0.3"):
        train(small_train(steps=4, clip=0.3), run, resume=True, progress=False)
    toml = run / "config.toml"
    toml.write_text(toml.read_text().replace("steps = 3", "steps = 5"))
    with pytest.raises(ValueError, match=r"config.toml was edited after the run began \(steps"):
        train(small_train(steps=5), run, resume=True, progress=False)
    assert len(read_metrics(run)) == 3 and not os.path.exists(run / "config.toml.tmp")


def test_a_config_made_in_code_resumes_as_its_config_toml_reads_back(tmp_path: Path) -> None:
    """Integers given for float fields (``time_limit_start=60``) are the same config as the
    ``60.0`` config.toml reads back: not an edit."""
    run = tmp_path / "run"
    cfg = small_train(steps=2, time_limit_start=60, time_limit_end=60, lora_alpha=16)
    train(cfg, run, progress=False, stop_after=1)
    assert len(train(cfg, run, resume=True, progress=False)) == 1


def test_a_run_from_before_the_config_record_resumes_and_gets_one(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(small_train(steps=2), run, progress=False, stop_after=1)
    (run / "config.json").unlink()
    assert len(train(small_train(steps=2), run, resume=True, progress=False)) == 1
    record = json.loads((run / "config.json").read_text())
    assert record["config"]["steps"] == 2 and len(record["digest"]) == 32


def test_a_run_begun_before_a_field_was_added_resumes_and_an_edit_is_still_refused(
    tmp_path: Path,
) -> None:
    """A run whose record lacks a field TrainConfig has since gained (its config.json, written
    by the older version, has neither the field nor its digest) resumes: the field at its
    default is no edit. A real edit of a recorded field is still refused."""
    run = tmp_path / "run"
    train(small_train(steps=2), run, progress=False, stop_after=1)
    record = json.loads((run / "config.json").read_text())
    added = ("fork_turns", "fork_samples", "fork_horizon")  # fields added after such a run
    old = {k: v for k, v in record["config"].items() if k not in added}
    digest = hashlib.blake2b(json.dumps(old, sort_keys=True).encode(), digest_size=16)
    (run / "config.json").write_text(json.dumps({"digest": digest.hexdigest(), "config": old}))
    toml = run / "config.toml"
    toml.write_text(
        "".join(x for x in toml.read_text().splitlines(True) if x.split(" ")[0] not in added)
    )
    assert len(train(small_train(steps=2), run, resume=True, progress=False)) == 1
    toml.write_text(toml.read_text().replace("clip = 0.2", "clip = 0.3"))
    with pytest.raises(ValueError, match=r"edited after the run began \(clip"):
        train(small_train(steps=3, clip=0.3), run, resume=True, progress=False)

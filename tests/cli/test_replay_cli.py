"""What ``run``, ``replay`` and ``diff`` print about one episode agrees, and ``diff`` says what
it compares (issue 31). Real subprocesses of the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collective import load_episode
from tests.support.busy import scaled

CLI = [sys.executable, "-m", "collective.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=scaled(120), env=dict(os.environ)
    )


# a seed for each organisation whose episode ends with answers that never landed
@pytest.mark.parametrize(
    ("org", "seed"), [("flat", 1), ("ceo", 1), ("orchestrator", 2), ("islands:2", 3)]
)
def test_run_replay_and_diff_count_the_same_turns(tmp_path: Path, org: str, seed: int) -> None:
    ep = tmp_path / "ep.msgpack"
    args = [
        "--agents",
        "4",
        "--seed",
        str(seed),
        "--time-limit",
        "60",
        "--org",
        org,
        "--budget",
        "2",
    ]
    r = _cli("run", "workshop", *args, "--out", str(ep))
    assert r.returncode == 0, r.stderr
    ran = json.loads(r.stdout)["turns"]
    # The file keeps answers that never landed (in flight at the end, or to an agent fired
    # while it thought) as turn records, so that a replay can give them again: the case where
    # the two counts could part.
    record = load_episode(ep)
    assert len(record.turns) > record.stats.turns == ran
    r = _cli("replay", str(ep))
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["turns"] == ran
    r = _cli("diff", str(ep), str(ep))
    assert r.returncode == 0 and f", {ran} turns)" in r.stdout, r.stdout


def test_diff_shows_no_negative_zero_and_pairs_each_outcome_with_its_own_turn(
    tmp_path: Path,
) -> None:
    ep, fork = tmp_path / "ep.msgpack", tmp_path / "fork.msgpack"
    run = ["--agents", "4", "--seed", "1", "--time-limit", "100", "--policy", "tiny"]
    assert _cli("run", "workshop", *run, "--out", str(ep)).returncode == 0
    r = _cli(
        "replay", str(ep), "--until", "20", "--policy", "random", "--seed", "7", "--out", str(fork)
    )
    assert r.returncode == 0, r.stderr
    a, b = load_episode(ep), load_episode(fork)
    # the random policy's logprob of a forced token is sometimes -0.0, equal to 0.0
    assert any(str(x) == "-0.0" for t in b.turns for x in t.logprobs)
    r = _cli("diff", str(ep), str(fork))
    assert r.returncode == 1
    assert "-0.0" not in r.stdout, r.stdout
    outcome = [line for line in r.stdout.splitlines() if "outcome" in line]
    assert outcome, r.stdout
    for line in outcome:
        if line.startswith("outcome "):  # the n-th to land on each side, two turns named
            index_a, index_b = (int(w.split("'")[0]) for w in line.split("turn ")[1:3])
            assert f"tool {a.turns[index_a].tool!r}" in line.split(" vs turn ")[0]
            assert f"tool {b.turns[index_b].tool!r}" in line.split(" vs turn ")[1]
        else:  # one turn's outcome on each side: what differs is that turn's
            index = int(line.split()[1])
            for field in ("tool", "kind", "result", "finished"):
                x, y = getattr(a.turns[index], field), getattr(b.turns[index], field)
                assert (x == y) != (f"{field} {x!r} vs {y!r}" in line), (field, line)


def test_a_random_run_and_fork_never_import_torch(tmp_path: Path) -> None:
    """A fork of 0.09 s of episode took 3.4 s: finding the episode's tokenizer asked whether the
    policy was a ``TinyPolicy``, which imported torch. Neither command needs it for a random
    policy (the episode bytes are the same: bench/golden.py)."""
    ep, fork = tmp_path / "ep.msgpack", tmp_path / "fork.msgpack"
    script = (
        "import sys; from collective.cli import main; "
        f"assert main(['run', 'workshop', '--agents', '4', '--out', {str(ep)!r}]) == 0; "
        f"assert main(['replay', {str(ep)!r}, '--until', '100', '--policy', 'random', "
        f"'--seed', '7', '--out', {str(fork)!r}]) == 0; "
        "print('torch' in sys.modules)"
    )
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=scaled(120)
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "False"
    assert load_episode(fork).config.tokenizer == "bytes"  # still declared by the policy

"""Long commands show their progress on a terminal, and nothing elsewhere: ``run``, ``replay``
and a fork, ``check``, ``show --png``, ``plot`` and the first step of ``train``, each a real
command with its stderr on a pseudo-terminal, then on a pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.busy import scaled
from tests.support.cli import on_a_terminal
from tests.support.training import SMALL_TOML

CLI = [sys.executable, "-m", "collective.cli"]


def _piped(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=scaled(120))


def test_run_replay_fork_and_show_draw_a_bar_on_a_terminal_only(tmp_path: Path) -> None:
    ep = tmp_path / "ep.msgpack"
    code, out, term = on_a_terminal(
        "run", "workshop", "--agents", "64", "--time-limit", "60", "--out", str(ep)
    )
    assert code == 0 and json.loads(out)["events"] > 0, term
    assert "run:" in term and " of 60 simulated s" in term, term[-1000:]
    assert term.endswith(" \r"), "the bar is cleared once the run is done"
    piped = _piped("run", "workshop", "--agents", "64", "--time-limit", "60")
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert json.loads(piped.stdout)["events"] == json.loads(out)["events"]

    code, out, term = on_a_terminal("replay", str(ep))
    assert code == 0 and json.loads(out)["replay"] == "identical", out
    assert "replay:" in term and " of 60 simulated s" in term, term[-1000:]
    assert _piped("replay", str(ep)).stderr == ""

    fork = tmp_path / "fork.msgpack"
    code, out, term = on_a_terminal("replay", str(ep), "--until", "30", "--out", str(fork))
    assert code == 0 and json.loads(out)["forked_at"] == 30, out
    assert "fork:" in term, term[-1000:]

    code, out, term = on_a_terminal("check", "tally", "--seeds", "1", "--time-limit", "40")
    assert code == 0 and "verdict: " in out, out
    assert "check:" in term and " of 40 simulated s" in term, term[-1000:]

    code, out, term = on_a_terminal("show", str(ep), "--png", str(tmp_path / "t.png"))
    assert code == 0 and out.strip() == str(tmp_path / "t.png"), out
    assert "show --png: reading" in term, term[-1000:]
    piped = _piped("show", str(ep), "--png", str(tmp_path / "u.png"))
    assert piped.returncode == 0 and "reading" not in piped.stderr, piped.stderr


def test_trainings_first_step_and_plot_say_what_they_do_on_a_terminal(tmp_path: Path) -> None:
    config = tmp_path / "small.toml"
    config.write_text(SMALL_TOML.replace("steps = 2", "steps = 1"))
    run = tmp_path / "run"
    code, out, term = on_a_terminal("train", str(config), "--out", str(run))
    assert code == 0, term[-2000:]
    # before the bar first moves, its episodes' simulated time: the first step is not silent
    assert "rolling out: t=" in term and "of 60 simulated s" in term, term[-2000:]
    code, out, term = on_a_terminal("plot", str(run))
    assert code == 0, term
    assert term.startswith(f"plot: drawing {run}'s metrics into {run / 'plots'}"), term
    assert {Path(p).name for p in out.split()} >= {"returns.png", "learner.png"}
    piped = _piped("plot", str(run))
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr


def test_a_run_watched_by_its_bar_is_the_run_without_it(tmp_path: Path) -> None:
    """The bar's clock reads each batch's requests (``policy.watched``); it must not change a
    thing the run does: the same metrics and the same episode bytes, with the bar and without."""
    from collective.rl.train import train
    from tests.support.training import comparable_metrics, small_train

    runs = {shown: tmp_path / f"bar-{shown}" for shown in (True, False)}
    for shown, run in runs.items():
        train(small_train(), run, progress=shown)
    assert comparable_metrics(runs[True]) == comparable_metrics(runs[False])
    names = sorted(p.name for p in (runs[True] / "episodes").iterdir())
    assert names and names == sorted(p.name for p in (runs[False] / "episodes").iterdir())
    for name in names:
        a, b = (runs[s] / "episodes" / name for s in (True, False))
        assert a.read_bytes() == b.read_bytes(), name


def test_the_bar_follows_the_simulated_clock_and_never_goes_back() -> None:
    from collective.base.progress import Clock, step_clock

    clock = Clock(100.0, "run")  # (off a terminal: counted, not drawn)
    shown = []
    for t in (0.0, 12.5, 40.0, 30.0, 250.0):
        clock.at(t)
        shown.append(clock.shown)
    assert shown == [0.0, 12.5, 40.0, 40.0, 100.0]
    clock.close()

    class Bar:
        def __init__(self) -> None:
            self.n = 0
            self.said: list[str] = []

        def set_postfix_str(self, text: str) -> None:
            self.said.append(text)

    bar = Bar()
    at = step_clock(bar, 60.0, "rolling out")
    for t in (0.0, 0.3, 1.0, 30.0):
        at(t)
    assert bar.said == [
        "rolling out: t=0 of 60 simulated s",
        "rolling out: t=1 of 60 simulated s",
        "rolling out: t=30 of 60 simulated s",
    ]
    bar.n = 1  # the first step is done: its ret and T take the place
    at(45.0)
    assert len(bar.said) == 3

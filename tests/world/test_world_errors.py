"""A bug in a world stops its episode and says where: every world method the engine calls, on a
real episode. The episode ends ``world_error`` right after a ``Failed`` event naming the world,
the method, the error and the file and line that raised; the record is whole up to there and
replays to the same bytes; training stops at the first such episode, keeps it, and resumes.
(The command line's one-line errors for these are rows of ``tests/cli/test_bad_input.py``.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from collective import Conductor, EpisodeConfig
from collective.records import Ended, Failed, encode_episode, world_error
from collective.replay import verify
from collective.rl.train import Learner, load_config, read_metrics, train
from policy.base import PolicyRequest
from policy.scripted import ScriptedPolicy
from tests.support import FRAGILE
from tests.support.episodes import by_turn, run
from tests.support.programs import jittery

FAULTY = f"{FRAGILE}:Faulty"


def bug_line(name: str) -> str:
    """``fragile.py:N``, where N is the line marked ``# bug: name``."""
    lines = FRAGILE.read_text().splitlines()
    mark = re.compile(rf"# bug: {re.escape(name)}( |$)")
    n = next(i for i, line in enumerate(lines, 1) if mark.search(line))
    return f"fragile.py:{n}"


def def_line(method: str) -> str:
    """``fragile.py:N``, where N is the line defining Faulty's ``method``."""
    text = FRAGILE.read_text()
    start = text.index("class Faulty(")
    n = text[: text.index(f"    def {method}(", start)].count("\n") + 1
    return f"fragile.py:{n}"


def add_twice(req: PolicyRequest) -> str:
    return "add 2" if req.turn < 3 else "wait 0"


def talk(req: PolicyRequest) -> str:
    return 'msg 0 "hi"' if req.agent == 1 and req.turn == 0 else "wait 0"


def hire_then_fire(req: PolicyRequest) -> str:
    if req.agent == 0:
        return ("hire worker", "fire 1")[req.turn] if req.turn < 2 else "wait 0"
    return "wait 0"


# bug -> (policy script, agents, budget, method in the error, error, where)
BUGS = {
    "tool": (add_twice, 1, 0, "add (tool)", "KeyError: 'no such thing'", bug_line("tool")),
    "duration": (
        add_twice,
        1,
        0,
        "add (duration)",
        "ValueError: the duration of add must be >= 0, got -10.0",
        bug_line("duration"),
    ),
    "event": (by_turn("wait 0"), 1, 0, "boom (world event)", "boom 7", bug_line("event")),
    "schedule": (
        add_twice,
        1,
        0,
        "add (tool)",
        "TypeError: Faulty.at: an argument is a Faulty",
        bug_line("schedule"),
    ),
    "observe": (add_twice, 1, 0, "observe", "IndexError: nothing to see", bug_line("observe")),
    "observe-int": (add_twice, 1, 0, "observe", "observe() returned int 42", def_line("observe")),
    "observe-at": (
        add_twice,
        1,
        0,
        "observe",
        "RuntimeError: at() and after()",
        bug_line("observe-at"),
    ),
    "score": (add_twice, 1, 0, "score", "score() returned 1.5, not a number", def_line("score")),
    "done": (add_twice, 1, 0, "done", "ZeroDivisionError: done? who knows", bug_line("done")),
    "heard": (talk, 2, 0, "heard", "UnicodeError: cannot hear that", bug_line("heard")),
    "join": (hire_then_fire, 1, 1, "join", "LookupError: no desk", bug_line("join")),
    "leave": (hire_then_fire, 1, 1, "leave", "LookupError: nobody to see", bug_line("leave")),
    "metrics": (add_twice, 1, 0, "metrics", "AttributeError: no counters", bug_line("metrics")),
    "close": (add_twice, 1, 0, "close", "OSError: cannot remove", bug_line("close")),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_world_bug_ends_the_episode_naming_method_error_and_line(bug: str) -> None:
    script, agents, budget, method, error, where = BUGS[bug]
    ep = run(script, world=FAULTY, params={"bug": bug}, agents=agents, budget=budget, time_limit=60)
    assert ep.end == "world_error"
    *_, failed, ended = ep.events
    assert isinstance(failed, Failed) and isinstance(ended, Ended), ep.events[-4:]
    assert ended.reason == "world_error" and failed.t == ended.t
    assert (failed.world, failed.method, failed.where) == ("Faulty", method, where)
    assert error in failed.error
    assert sum(isinstance(e, Failed) for e in ep.events) == 1, "one failure: the first"
    line = world_error(ep)
    assert line.startswith(f"world {FAULTY!r} failed at t=") and where in line and "\n" not in line
    assert ep.score == ep.curve[-1][1] and 0 <= ep.score <= 1
    assert verify(ep) is None, "an episode cut by a world bug replays to the same events"


def test_nothing_is_committed_after_the_bug() -> None:
    # Four agents add at once; the first whose add raises ends the episode at that instant.
    ep = run(lambda r: "add 2", world=FAULTY, params={"bug": "tool"}, agents=4, time_limit=60)
    failed = next(e for e in ep.events if isinstance(e, Failed))
    assert ep.events.index(failed) == len(ep.events) - 2
    assert failed.agent == 0, "the canonical order: agent 0's add lands first"
    assert ep.duration == failed.t and ep.stats.tool_errors == 0


def test_observations_failing_at_once_are_reported_the_same_whatever_trio_does() -> None:
    # Every agent's add lands at the same instant, and then every observation raises: the
    # lowest agent's is the one named, whichever actor trio happened to run first.
    cfg = EpisodeConfig(
        world=FAULTY, params={"bug": "observe"}, agents=6, time_limit=60, max_output_tokens=64
    )
    policy = ScriptedPolicy(by_turn("add 1"))
    runs = set()
    for _ in range(5):
        conductor = Conductor(policy, program=jittery)
        ep = trio.run(lambda c=conductor: c.play([cfg]))[0]
        runs.add(encode_episode(ep))
    assert len(runs) == 1
    failed = next(e for e in ep.events if isinstance(e, Failed))
    assert failed.agent == 0 and failed.method == "observe"


def test_training_stops_at_the_first_world_error_keeps_it_and_resumes(tmp_path: Path) -> None:
    world = tmp_path / "flaky.py"
    source = FRAGILE.read_text()
    world.write_text(source)
    config = tmp_path / "small.toml"
    config.write_text(
        f'world = "{world}:Faulty"\nparams = {{bug = "tool"}}\nteam_sizes = [2]\nsteps = 2\n'
        "groups_per_step = 2\ngroup_size = 2\ntime_limit_start = 30.0\ntime_limit_end = 30.0\n"
        "concurrency = 4\nmax_output_tokens = 12\nplots = false\n"
        "[model]\nd_model = 32\nn_layers = 1\nn_heads = 2\nd_ff = 64\ncontext = 96\n"
    )
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError) as caught:
        train(load_config(config), run_dir, progress=False)
    message = str(caught.value)
    assert "\n" not in message and "Faulty.add (tool, agent" in message
    assert "KeyError: 'no such thing'" in message
    assert bug_line("tool").replace("fragile.py", "flaky.py") in message
    kept = re.search(r"the episode is kept in (\S+);", message)
    assert kept and Path(kept[1]).is_file() and Path(kept[1]).parent == run_dir / "failed"
    assert f"collective train --resume {run_dir}" in message
    assert not (run_dir / "episodes" / Path(kept[1]).name).exists(), "never learned from"
    # The world fixed (the bug taken out), the run resumes and finishes.
    world.write_text(source.replace('raise KeyError("no such thing")', "pass"))
    from collective.engine import registry

    registry._loaded.clear()  # a new process would import the fixed file afresh
    train(load_config(run_dir / "config.toml"), run_dir, resume=True, progress=False)
    assert len(read_metrics(run_dir)) == 2


def test_a_lone_error_inside_training_is_one_line_and_the_run_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The learner's first step fails (standing in for what no CPU run here can provoke: an
    # xgrammar refusal in a GPU learner's replay). The error reaches the command line as itself,
    # not inside trio's ExceptionGroup; the episodes already written are kept, and resume uses
    # them. (A start that fails before keeping anything leaves nothing: test_bad_input.)
    from collective import cli

    def refuse(self: Learner, samples: object) -> dict[str, float]:
        raise ValueError("the learner refused its first batch")

    config = tmp_path / "small.toml"
    config.write_text(
        'world = "tally"\nteam_sizes = [1]\nsteps = 1\ngroups_per_step = 1\ngroup_size = 2\n'
        "time_limit_start = 20.0\ntime_limit_end = 20.0\nmax_output_tokens = 12\nplots = false\n"
        "[model]\nd_model = 32\nn_layers = 1\nn_heads = 2\nd_ff = 64\ncontext = 96\n"
    )
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(Learner, "step", refuse)
        assert cli.main(["train", str(config), "--out", str(run_dir), "--quiet"]) == 2
    assert (
        capsys.readouterr().err == "collective train: error: the learner refused its first batch\n"
    )
    kept = sorted(p.name for p in (run_dir / "episodes").iterdir())
    assert kept == ["g000000-r00.msgpack", "g000000-r01.msgpack"]
    assert cli.main(["train", "--resume", str(run_dir), "--quiet"]) == 0
    assert len(read_metrics(run_dir)) == 1

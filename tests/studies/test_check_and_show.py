"""What an author runs on a world: ``collective check`` (bugs, determinism, and whether a random
team leaves a policy something to learn) and ``collective show --observations`` (what each agent
saw). Real episodes throughout; the verdicts are checked on worlds built to be each case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from collective import EpisodeConfig, load_episode, run_episode
from collective.base.latency import PRESETS
from collective.cli import main
from collective.studies.check import check_world, score_before
from policy.uniform import RandomPolicy
from tests.support import FRAGILE, ROOT
from tests.support.busy import scaled
from tests.support.training import SMALL_TOML

GARDEN = f"{ROOT / 'examples' / 'garden.py'}:Garden"
QUICK = ["--agents", "3", "--seeds", "2", "--rollouts", "3"]


def test_check_a_sound_world_prints_its_findings_and_the_random_teams_scores(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", GARDEN, *QUICK, "--time-limit", "160"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"check {GARDEN}: 3 agents, 2 world seeds x 3 rollouts")
    assert [line[:4] for line in out[1:5]] == ["ok  "] * 4
    assert "2 tools (water, harvest)" in out[1] and "replay identical" in out[3]
    rows = [line.split() for line in out if line.startswith("  ") and line.rstrip().endswith("%")]
    assert [r[0] for r in rows] == ["40", "80", "160"]
    means = [float(r[2]) for r in rows]
    assert means == sorted(means), "a monotone world's random team only gains with time"
    assert out[-2].startswith("verdict: something to learn at 160 s")


@pytest.mark.parametrize(
    ("world", "params", "limit", "verdict"),
    [
        (f"{FRAGILE}:Stuck", {}, 120, "nothing to learn at 120 s: no random rollout scored"),
        ("tally", {"target": 1}, 240, "saturated: a random team already scores 1.000 by 60 s"),
        ("tally", {"target": 1}, 120, "little to learn at 120 s: a random team nearly finishes"),
        ("tally", {}, 120, "something to learn at 120 s"),
        # a mean of 0.020 with a spread, but one rollout in six scored: most groups are all 0
        ("market", {}, 200, "too little to learn at 200 s: only 17% of random rollouts scored"),
    ],
)
def test_check_says_whether_a_world_gives_a_policy_something_to_learn(
    world: str, params: dict, limit: float, verdict: str
) -> None:
    report = check_world(world, params, agents=2, seeds=2, rollouts=3, time_limit=limit)
    assert report.ok, report.lines()
    assert report.verdict.startswith(verdict), report.verdict


def test_check_claims_nothing_of_a_world_that_raised_and_exits_as_run_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["check", f"{FRAGILE}:Faulty", "--param", "bug=score", *QUICK])
    out, err = capsys.readouterr()
    assert code == 2  # as `collective run` exits on a world error
    assert err.count("\n") == 1 and "score() returned 1.5" in err
    assert "FAIL  6 of 6 episodes ended world_error" in out
    # no episode ran to its end: nothing is ok about its score or its determinism
    assert "score in [0, 1]" not in out and "deterministic" not in out, out
    assert "not checked until the world error is fixed" in out
    assert "verdict" not in out


def test_check_states_the_rule_of_its_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "tally", *QUICK, "--time-limit", "60"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("verdict: something to learn at 60 s")
    assert out[-1] == (
        "  (something to learn: at least 25% of rollouts score, a spread within a world seed, "
        "and a mean under 0.95)"
    )


@pytest.mark.parametrize("world", ["wildfire", GARDEN, "market"])
def test_the_score_at_a_shorter_limit_is_what_an_episode_cut_there_ends_with(world: str) -> None:
    cfg = EpisodeConfig(
        world=world, agents=3, world_seed=2, time_limit=240, latency=PRESETS["tiny"]
    )
    whole = run_episode(cfg, RandomPolicy())
    for limit in (17.3, 60.0, 120.0, 239.0):
        cut = run_episode(msgspec.structs.replace(cfg, time_limit=limit), RandomPolicy())
        assert score_before(whole, limit) == cut.score, limit


def test_show_observations_prints_what_each_agent_saw_and_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ep.msgpack"
    assert main(["run", "wildfire", "--agents", "2", "--time-limit", "200", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["show", str(out), "--observations", "--agent", "1"]) == 0
    text = capsys.readouterr().out
    ep = load_episode(out)
    turns = [t for t in ep.turns if t.agent == 1]
    assert text.count(" agent 1 turn ") == len(turns) and " agent 0 turn " not in text
    for t in turns:  # every prompt, line by line, and the answer it got
        assert all(f"| {line}\n" in text for line in t.prompt.split("\n"))
        assert f"decides: {t.text!r}" in text
    assert "fire at p" in text, "the world's posts are among what agents saw"
    assert main(["show", str(out), "--observations", "--limit", "3"]) == 0
    assert capsys.readouterr().out.count(" sees:\n") == 3


def test_a_world_bug_run_writes_the_episode_and_show_names_the_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bug.msgpack"
    world = f"{FRAGILE}:Faulty"
    assert main(["run", world, "--param", "bug=event", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the episode is in {out}" in err
    assert "Faulty.boom (world event) raised RuntimeError: boom 7 at fragile.py:" in err
    ep = load_episode(out)
    assert ep.end == "world_error"
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "world event: boom(7)" in shown and "WORLD ERROR: Faulty.boom (world event)" in shown
    assert shown.rstrip().endswith(
        "raised RuntimeError: boom 7 at " + err.split(" at ")[-1].split(";")[0]
    )
    assert main(["replay", str(out), "--world", world]) == 0


def test_check_names_where_two_runs_of_a_seed_part_and_gives_no_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A world that draws from the global random stream: the FAIL names the first event where
    the two runs part and what differed, and no learnability verdict follows it (the scores of
    a world that does not repeat itself say nothing of what a policy could learn)."""
    assert main(["check", f"{FRAGILE}:Unseeded", *QUICK, "--time-limit", "60"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("FAIL  the same seed"))
    assert "the two runs part at event " in lines[at] and "(t=" in lines[at], lines[at]
    assert lines[at + 1].startswith("      first:  ") and lines[at + 2].startswith("      second: ")
    assert lines[at + 1] != lines[at + 2].replace("second:", "first: ")
    assert lines[at + 3].startswith("      differs in: "), lines[at + 3]
    assert "self.rng" in lines[at + 4]
    assert "verdict:" not in out and "random team's score" not in out
    assert "no verdict on whether there is something to learn" in out


@pytest.mark.parametrize("command", ["run", "check"])
def test_verbose_on_a_world_error_shows_the_worlds_traceback_not_the_tools(command: str) -> None:
    """``-v``: the world's traceback (logged where the bug happened), then the one line; not a
    traceback of the command line's own, which would read as a crash of the tool."""
    argv = [command, f"{FRAGILE}:Faulty", "--param", "bug=event"]
    if command == "check":
        argv += QUICK
    done = subprocess.run(
        [sys.executable, "-m", "collective.cli", "-v", *argv],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "fragile.py" in done.stderr and "RuntimeError: boom 7" in done.stderr
    assert "collective/cli" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"collective {command}: error: world ") and "-v for" not in last


def test_run_and_show_summaries_carry_the_worlds_own_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ep.msgpack"
    assert (
        main(
            ["run", f"{FRAGILE}:Refuses", "--agents", "2", "--time-limit", "20", "--out", str(out)]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    metrics = load_episode(out).world_metrics
    assert metrics["count"] > 0 and summary["world_metrics"] == metrics
    assert main(["show", str(out), "--limit", "1"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"# world metrics: count {metrics['count']:g}, rang {metrics['rang']:g}"


def test_check_judges_the_policy_it_is_given_not_a_random_team() -> None:
    """The same world, a random team and a team that only waits: the random team leaves
    something to learn, the waiting team nothing, and the report says whose episodes it read.
    A team whose every call is refused is told so beside its scores."""
    from policy.scripted import ScriptedPolicy

    args = {"agents": 2, "seeds": 2, "rollouts": 3, "time_limit": 120.0}
    random = check_world("tally", {}, **args)
    assert random.verdict.startswith("something to learn at 120 s: a random team scores")
    idle = check_world(
        "tally", {}, policy=ScriptedPolicy(lambda r: "wait 5"), who="team of waiters", **args
    )
    assert idle.ok, idle.lines()
    assert idle.verdict.startswith(
        "nothing to learn at 120 s: no rollout of the team of waiters scored"
    ), idle.verdict
    lines = idle.lines()
    assert "6 episodes of the team of waiters ran to their end" in lines[1]
    assert any(line.startswith("The team of waiters's score at each time limit") for line in lines)
    refused = check_world(
        f"{FRAGILE}:Refuses", {}, policy=ScriptedPolicy(lambda r: "spend"), who="team", **args
    )
    assert "note  actions: " in "\n".join(refused.lines())
    assert "100% refused by the world or the engine, 0% not an action" in "\n".join(refused.lines())


def test_check_with_a_config_plays_the_runs_episodes_with_its_untrained_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``check --config``: the world, its largest team, the group size, the first time limit
    and the latency are the config's, and the team plays the tiny model the run starts from
    (fresh weights of the config's shape): the episodes say so, as training's first ones do."""
    config = tmp_path / "small.toml"
    config.write_text(SMALL_TOML)
    assert main(["check", "--config", str(config), "--seeds", "1"]) in (0, 1)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        "check tally {'target': 12}: 3 agents, 1 world seeds x 3 rollouts of the team of the "
        "untrained tiny model, T = 60 s, latency tiny (the episodes"
    ), out[0]
    assert "and the policy it starts from" in out[0]
    assert "3 episodes of the team of the untrained tiny model ran to their end" in out[2]
    assert out[-2].startswith("verdict: ") and "the untrained tiny model" in out[-2]
    # --policy and the flags replace what the config says
    assert main(["check", "tally", "--config", str(config), "--policy", "random", "--seeds",
                 "1", "--agents", "2", "--time-limit", "30"]) == 0  # fmt: skip
    first = capsys.readouterr().out.splitlines()[0]
    assert "2 agents, 1 world seeds x 3 rollouts of a random team, T = 30 s" in first, first
    # another world in the config's place (as `train --set world=...` puts it), its params not
    assert main(["check", GARDEN, "--config", str(config), "--seeds", "1"]) in (0, 1)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"check {GARDEN}: 3 agents, 1 world seeds x 3 rollouts of the team "
                            "of the untrained tiny model, T = 60 s"), first  # fmt: skip

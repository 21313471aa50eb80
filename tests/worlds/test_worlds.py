"""The built-in worlds and the guide's example: seeded, scored in [0, 1] (monotone where they
say so), valid from 1 to 1,000 agents, and strict about their tools' arguments. Every test runs
real episodes on the real engine; the repo world's tests run real code in the real sandbox."""

from __future__ import annotations

import re
import statistics
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collective import (
    Episode,
    EpisodeConfig,
    ToolError,
    World,
    resolve_world,
    run_episode,
    run_episodes,
)
from collective.records import Committed, Delivered, Rejected, Sent, encode_episode
from collective.replay import verify
from policy.base import PolicyRequest
from policy.uniform import RandomPolicy
from tests.support import EAR as EAR_PY
from tests.support import ROOT
from tests.support.episodes import by_turn, run
from worlds import BUILTIN
from worlds.market import Market
from worlds.relay import Relay
from worlds.repo import Repo
from worlds.workshop import Workshop

GARDEN = f"{ROOT / 'examples' / 'garden.py'}:Garden"
# These tests are about the repo world, not its sandbox (tests/worlds/test_sandbox.py): they run
# where the machine has no user namespaces too, opted in, and use them where it has.
REPO = {"allow_without_namespaces": True}
# Every world with parameters that keep a random-policy episode short. The repo world runs real
# test suites; its scale checks put many agents on copies of the package (team_size).
WORLDS: dict[str, dict[str, Any]] = {
    "tally": {},
    "workshop": {},
    "relay": {},
    "market": {},
    "repo": {"wall_seconds": 5.0, "cpu_seconds": 2, **REPO},
    "wildfire": {"horizon": 10.0},  # fires from the first seconds, even in short episodes
    GARDEN: {},
}


def random_episode(world: str, agents: int, seed: int, limit: float, **params: Any) -> Episode:
    cfg = EpisodeConfig(
        world=world,
        params={**WORLDS[world], **params},
        agents=agents,
        world_seed=seed,
        sample_seed=seed + 1,
        time_limit=limit,
        latency=_tiny(),
    )
    return run_episode(cfg, RandomPolicy())


def _tiny() -> Any:
    from collective.base.latency import PRESETS

    return PRESETS["tiny"]


def test_every_builtin_is_registered_and_loads() -> None:
    assert set(BUILTIN) >= {"tally", "workshop", "relay", "market", "repo", "wildfire"}
    for name in BUILTIN:
        assert issubclass(resolve_world(name), World)


# -- determinism -------------------------------------------------------------------------------


@pytest.mark.parametrize("world", list(WORLDS))
def test_same_seed_same_bytes_and_replay_is_identical(world: str) -> None:
    a = random_episode(world, agents=3, seed=11, limit=120)
    b = random_episode(world, agents=3, seed=11, limit=120)
    assert encode_episode(a) == encode_episode(b)
    assert verify(a) is None  # replay re-executes it, tools and all, event for event
    other = random_episode(world, agents=3, seed=12, limit=120)
    assert encode_episode(other) != encode_episode(a)


# -- the anytime score -------------------------------------------------------------------------


def _check_curve(world: str, ep: Episode) -> None:
    scores = [s for _, s in ep.curve]
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert 0.0 <= ep.score <= 1.0 and ep.score == scores[-1]
    assert [t for t, _ in ep.curve] == sorted(t for t, _ in ep.curve)
    if resolve_world(world).monotone:
        assert scores == sorted(scores), f"{world} declares monotone but its score fell"


@pytest.mark.parametrize("world", [w for w in WORLDS if w != "repo"])
@settings(max_examples=12)
@given(seed=st.integers(0, 2**31), agents=st.integers(1, 8), limit=st.floats(5, 400))
def test_score_stays_in_unit_interval_and_monotone_where_declared(
    world: str, seed: int, agents: int, limit: float
) -> None:
    _check_curve(world, random_episode(world, agents, seed, limit))


@settings(max_examples=4)
@given(seed=st.integers(0, 2**31), agents=st.integers(1, 3), limit=st.floats(5, 60))
def test_repo_score_stays_in_unit_interval(seed: int, agents: int, limit: float) -> None:
    _check_curve("repo", random_episode("repo", agents, seed, limit))


# -- scale -------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", list(WORLDS))
@pytest.mark.parametrize("agents", [1, 10, 1000])
def test_valid_from_one_to_a_thousand_agents(world: str, agents: int) -> None:
    # Short runs: every agent acts at least once. The repo world gets one package copy per 100
    # agents and slow test runs, so this checks its bookkeeping, not 1,000 real test suites.
    extra = {"team_size": 100, "test_seconds": 30.0, "run_seconds": 30.0} if world == "repo" else {}
    ep = random_episode(world, agents, seed=agents, limit=12, **extra)
    _check_curve(world, ep)
    assert len({t.agent for t in ep.turns}) == agents
    observations = [t.prompt.split("\n")[0] for t in ep.turns]
    assert max(len(o.encode()) for o in observations) < 200  # a small local view, at any scale


@pytest.mark.parametrize("cls", [Workshop, Relay, Market])
def test_ten_thousand_agents_cost_little_per_observation(cls: type[World]) -> None:
    w = cls(n_agents=10_000, seed=3)
    views = [w.observe(a) for a in range(0, 10_000, 97)]
    assert max(len(v) for v in views) < 200
    assert len(set(views)) > len(views) // 2  # each agent sees its own corner of the world
    assert 0.0 <= w.score() <= 1.0


# -- tools reject bad arguments with a clear error ---------------------------------------------

# world -> (params, agent 0's actions, the errors expected: ("reject"|"fail", substring))
BAD_ARGS: dict[str, tuple[dict[str, Any], list[str], list[tuple[str, str]]]] = {
    "tally": (
        {},
        ["add 9", 'note "forbidden"'],
        [("reject", "add: amount must be in 1..3, got 9"), ("fail", "that word is not allowed")],
    ),
    "workshop": (
        {"modules": 1, "knowledge": 0.0},
        ["work 0", "work two", "work 2"],
        [
            ("reject", "work: slot must be in 1..3, got 0"),
            ("reject", "work: slot must be an integer, got 'two'"),
            ("fail", "slot 2 is empty: your desk has 1 ready module(s)"),
        ],
    ),
    "relay": (
        {},
        ["submit 5 ka mo", "submit 0 xx mo", "submit 0 ka"],
        [
            ("reject", "submit: part must be in 0..1, got 5"),
            ("reject", "submit: first must be one of ['ka', 'mo',"),
            ("reject", "submit takes 3 argument(s)"),
        ],
    ),
    "market": (
        {"positions": 1},
        ["buy 7", "buy 0", "buy 0", "sell 1"],
        [
            ("reject", "buy: instrument must be in 0..1, got 7"),
            ("fail", "you already hold i0 long"),
            ("fail", "you hold 1 positions, the most allowed: close one first"),
        ],
    ),
    "repo": (
        {"task": "roman", **REPO},
        ["cat nope.py", 'write tests/test_convert.py "x"', 'run "1/0"'],
        [
            ("reject", "cat: path must be one of ['roman/__init__.py', 'roman/convert.py',"),
            ("reject", "write: path must be one of ['roman/__init__.py', 'roman/convert.py']"),
            ("fail", "ZeroDivisionError: division by zero"),
        ],
    ),
    "wildfire": (
        {"horizon": 0.0, "patches": 3},  # every patch catches fire at t = 0
        ["douse 99", "douse 0", "douse 0"],
        [("reject", "douse: patch must be in 0..2, got 99"), ("fail", "p0 is not burning")],
    ),
    GARDEN: (
        {},
        ["water 3", "harvest 0"],
        [("reject", "water: bed must be in 0..2, got 3"), ("fail", "bed 0 is not ripe")],
    ),
}


@pytest.mark.parametrize("world", list(BAD_ARGS))
def test_tools_reject_bad_arguments_with_a_clear_error(world: str) -> None:
    params, actions, expected = BAD_ARGS[world]
    ep = run(by_turn(*actions), world=world, params=params, agents=1, time_limit=200)
    errors = [
        ("reject", e.error) if isinstance(e, Rejected) else ("fail", e.result)
        for e in ep.events
        if isinstance(e, Rejected) or (isinstance(e, Committed) and not e.ok)
    ]
    assert len(errors) == len(expected), errors
    for (kind, text), (want_kind, want) in zip(errors, expected, strict=True):
        assert kind == want_kind and want in text, (kind, text)


def test_bad_constructor_parameters_are_named() -> None:
    with pytest.raises(ValueError, match=r"Workshop: parallel must be in \[0, 1\], got 2"):
        Workshop(parallel=2)
    with pytest.raises(ValueError, match="Repo: unknown task 'nope'; tasks are: roman"):
        Repo(task="nope")
    with pytest.raises(ValueError, match="Market: depth must be >= 1, got 0"):
        Market(depth=0)


# -- the engine hooks the worlds use -----------------------------------------------------------


EAR = f"{EAR_PY}:Ear"


def test_worlds_see_simulated_time_and_hear_messages_and_posts() -> None:
    plan = ["clock", 'msg 1 "hi there"', 'post all "k0 all"', "who 1"]
    ep = run(
        lambda r: plan[r.turn] if r.agent == 0 and r.turn < 4 else "wait 0",
        world=EAR,
        agents=2,
        time_limit=60,
    )
    commits = [e for e in ep.events if isinstance(e, Committed) and e.agent == 0]
    clock = next(e for e in commits if e.tool == "clock")
    assert clock.result == f"now={clock.t:.3f}"  # the world's clock is the episode's
    who = next(e for e in commits if e.tool == "who")
    assert who.result.startswith("1 is agent 1;")
    assert "(0, 1, 'hi there')" in who.result and "(0, None, 'k0 all')" in who.result
    prompt = next(t.prompt for t in ep.turns if t.agent == 0 and t.turn == 1)
    assert prompt.startswith(f"t={clock.t:.3f}")  # observations read the same clock


def test_islands_worlds_name_engine_wide_ids() -> None:
    ep = run(lambda r: "who 1", world=EAR, agents=4, org="islands", time_limit=3)
    # Group 1 holds engine agents 2 and 3; its world's agent 1 is engine agent 3.
    who = next(e for e in ep.events if isinstance(e, Committed) and e.agent == 2)
    assert who.result.startswith("1 is agent 3;")


# -- workshop ----------------------------------------------------------------------------------


def greedy(req: PolicyRequest) -> str:
    """Work slot 1; share a key as soon as it is wanted. The behaviour training should find."""
    wanted = re.search(r"wanted: (k\d+)", req.prompt)
    return f'post all "{wanted.group(1)}"' if wanted else "work 1"


def test_workshop_parallel_work_pays() -> None:
    # One fixed project of 16 modules: four agents finish it much sooner than one.
    def finish(agents: int) -> float:
        eps = [
            run(greedy, world="workshop", params={"modules": 16}, agents=agents, world_seed=s)
            for s in range(3)
        ]
        assert all(e.score == 1.0 for e in eps)
        return statistics.mean(e.duration for e in eps)

    assert finish(4) < finish(1) / 2.5


def test_workshop_random_policy_is_clearly_below_a_good_one() -> None:
    cfgs = [
        EpisodeConfig(
            world="workshop",
            agents=4,
            world_seed=s,
            sample_seed=s,
            time_limit=150,
            latency=_tiny(),
        )
        for s in range(6)
    ]
    rand = statistics.mean(e.score for e in run_episodes(cfgs, RandomPolicy(), concurrency=6))
    from policy.scripted import ScriptedPolicy

    good = statistics.mean(
        e.score for e in run_episodes(cfgs, ScriptedPolicy(greedy), concurrency=6)
    )
    assert good > 0.95 and rand < 0.6 and good - rand > 0.4


def test_workshop_knowledge_travels_by_message_and_is_logged() -> None:
    params = {"modules": 2, "parallel": 1.0, "depth": 1, "knowledge": 1.0, "keys": 2}
    w = Workshop(n_agents=2, seed=5, **params)
    holder = w.holder[w.key_of[0]]  # who alone knows the key module m0 needs
    learner = 1 - holder
    key = f"k{w.key_of[0]}"
    assert not w.knows(learner, w.key_of[0])
    desk = w._desk(learner)
    slot = desk.index(0) + 1

    def script(r: PolicyRequest) -> str:
        if r.agent == learner:
            return ["wait 0", f"work {slot}", "wait 0"][min(r.turn, 2)]
        return [f'msg {learner} "take {key}"', "wait 0"][min(r.turn, 1)]

    ep = run(script, world="workshop", params=params, agents=2, world_seed=5, time_limit=100)
    sent = [e for e in ep.events if isinstance(e, Sent) and key in e.text]
    assert sent and sent[0].agent == holder and sent[0].to == learner
    assert any(isinstance(e, Delivered) and e.msg == sent[0].msg for e in ep.events)
    work = [e for e in ep.events if isinstance(e, Committed) and e.tool == "work"]
    assert work and work[0].agent == learner and work[0].ok, work

    # Without the message, the same work is refused, and the key's holder sees it is wanted.
    def alone(r: PolicyRequest) -> str:
        return f"work {slot}" if r.agent == learner and r.turn == 0 else "wait 0"

    ep = run(alone, world="workshop", params=params, agents=2, world_seed=5, time_limit=100)
    refused = next(e for e in ep.events if isinstance(e, Committed) and e.tool == "work")
    assert not refused.ok and f"m0 needs key {key}, which you do not know" in refused.result
    w.observe(learner)
    with pytest.raises(ToolError, match=f"needs key {key}"):
        w.work(learner, slot)
    assert f"wanted: {key}." in w.observe(holder)


def test_workshop_a_bluff_teaches_nothing_and_a_post_teaches_everyone() -> None:
    w = Workshop(n_agents=3, seed=1, keys=3)  # each agent starts with one key of its own
    holder = w.holder[0]
    stranger, other = (a for a in range(3) if a != holder)
    w.heard(stranger, other, "k0")  # says the key without knowing it
    assert not w.knows(other, 0)
    w.heard(holder, other, "psst k0")
    assert w.knows(other, 0) and not w.knows(stranger, 0)
    w.heard(holder, None, "here is k0")
    assert all(w.knows(a, 0) for a in range(3))


def test_workshop_two_agents_on_one_module_at_once_waste_work() -> None:
    w = Workshop(n_agents=2, seed=0, modules=1, units=3, knowledge=0.0, duplicate_penalty=0.5)
    w.need[0] = 3
    for a in (0, 1):
        w.observe(a)
    w.now = 10.0
    assert w.work(0, 1) == "m0: 2 left"
    w.now = 12.0  # agent 1 began at 2.0, while agent 0's unit was under way
    assert w.work(1, 1) == "clashed with agent 0 on m0; 1.5 left"
    assert w.duplicates == 1
    w.now = 30.0  # no overlap now
    assert w.work(0, 1) == "m0: 0.5 left"
    w.now = 45.0
    assert w.work(0, 1) == "m0 built (1/1)" and w.score() == 1.0
    w.now = 50.0
    assert w.work(1, 1) == "m0 was already built: work wasted" and w.duplicates == 2


# -- relay and market --------------------------------------------------------------------------


def test_relay_halves_must_be_combined() -> None:
    w = Relay(n_agents=2, seed=4, size=1)
    first, second = w.answer[0]
    holder_of_end = w.end_of[0]
    assert f"p0 ends {second}" in w.observe(holder_of_end)
    assert f"p0 starts {first}" in w.observe(w.start_of[0])
    assert "p0 starts" not in w.observe(holder_of_end)  # it cannot see the start
    assert w.submit(holder_of_end, 0, first, second) == "p0 solved (1/2)"
    assert w.score() == 0.5


def test_market_prices_move_with_time_and_research_reveals_drift() -> None:
    w = Market(n_agents=1, seed=2, noise=0.0)
    p0 = w.price(0, 0.0)
    assert w.price(0, 10 * w.tick) == pytest.approx(p0 + 10 * w.drift[0])
    assert w.research(0, 0).startswith(f"i0 drifts {'up' if w.drift[0] > 0 else 'down'}")
    side = "buy" if w.drift[0] > 0 else "sell"
    getattr(w, side)(0, 0)
    w.now = 20 * w.tick
    closing = "sell" if side == "buy" else "buy"
    assert "+" in getattr(w, closing)(0, 0) and w.profit > 0 and w.score() > 0


# -- repo ------------------------------------------------------------------------------------


def _solve(task: str) -> list[str]:
    from worlds.repo import escape
    from worlds.repo_tasks import TASKS

    solution = next(t for t in TASKS if t.name == task).solution
    return ["test", *(f'write {p} "{escape(c)}"' for p, c in solution.items()), "test"]


@pytest.mark.parametrize("task", ["roman", "intervals", "textstats", "rpn"])
def test_repo_a_scripted_solution_reaches_one(task: str) -> None:
    params = {"task": task, **REPO}
    ep = run(by_turn(*_solve(task)), world="repo", params=params, agents=1, clock="hybrid")
    tests = [e for e in ep.events if isinstance(e, Committed) and e.tool == "test"]
    assert tests[0].ok and tests[0].result.startswith("0/")  # the stubs fail every test
    assert tests[-1].result.endswith("passed") and ep.score == 1.0 and ep.end == "done"
    assert all(e.real > 0 for e in tests)  # hybrid: the real duration is charged and logged
    assert verify(ep) is None


ESCAPES = {
    "network": (
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n",
        "blocked: network access",
    ),
    "outside": ("open({path!r}, 'w').write('escaped')\n", "blocked: writing outside the task"),
    "spin": ("while True:\n    pass\n", "stopped: it used more than its CPU time"),
    "sleep": ("import time\ntime.sleep(60)\n", "stopped: ran past the 2 s time limit"),
    "spawn": ("import os\nos.system('echo hi')\n", "blocked: starting a process"),
}


@pytest.mark.parametrize("attempt", list(ESCAPES))
def test_repo_escape_attempts_are_stopped_and_reported(attempt: str, tmp_path: Path) -> None:
    from worlds.repo import escape

    target = tmp_path / "escaped.txt"
    code, report = ESCAPES[attempt]
    code = code.format(path=str(target))
    module = code + "def to_roman(n):\n    return 'I'\n"
    # A spin must meet its CPU limit first, however busy the machine: a longer wall limit.
    wall = 30.0 if attempt == "spin" else 2.0
    params = {"task": "roman", "wall_seconds": wall, "cpu_seconds": 1, **REPO}
    actions = [f'write roman/convert.py "{escape(module)}"', "test", f'run "{escape(code)}"']
    ep = run(by_turn(*actions), world="repo", params=params, agents=1, time_limit=100)
    results = {e.tool: e for e in ep.events if isinstance(e, Committed)}
    assert not results["test"].ok and report in results["test"].result
    assert not results["run"].ok and report.split(":")[0] in results["run"].result
    assert not target.exists()
    assert ep.end in ("idle", "time_limit") and ep.score == 0.0  # the episode went on


def test_repo_a_team_copy_cannot_fill_the_disk() -> None:
    import trio

    w = Repo(seed=1, task="roman", disk_mb=1, **REPO)
    code = (
        "import os\nos.makedirs('junk')\n"
        "for i in range(3):\n    open(f'junk/{i}', 'w').write('x' * 500_000)\n"
    )
    try:
        with pytest.raises(
            ToolError, match="blocked: filling the disk: the package grew past 1 MB"
        ):
            trio.run(w.run, 0, code)
        d = w.dirs[0]
        assert not any((d / "junk").iterdir()), "what the task does not have is gone"
        assert all((d / path).is_file() for path in w.editable), "the package's own files stay"
        assert w.metrics()["blocked"] == 1
        assert trio.run(w.run, 0, "print('still works')").strip() == "still works"
    finally:
        w.close()


def test_repo_forged_test_results_score_nothing() -> None:
    """The finding: package code that reported passes from inside the test runner, then left,
    scored 1.0. Verdicts are the engine's now (tests/worlds/test_sandbox.py tries many more
    forgeries)."""
    from worlds.repo import escape

    forged = (
        "import __main__, os\n"
        "for name in ('add_mul', 'order', 'numbers', 'errors', 'zero'):\n"
        "    __main__.report('test', name='test_calc.test_' + name, ok=True, error='')\n"
        "os._exit(0)\n"
    )
    actions = [f'write rpn/calc.py "{escape(forged)}"', "test"]
    ep = run(by_turn(*actions), world="repo", params={"task": "rpn", **REPO}, time_limit=100)
    test = next(e for e in ep.events if isinstance(e, Committed) and e.tool == "test")
    assert test.result.startswith("0/5 passed") and ep.score == 0.0


def test_repo_editing_the_tests_changes_nothing() -> None:
    cheat = (
        "import os\nos.makedirs('tests', exist_ok=True)\n"
        "open('tests/test_convert.py', 'w').write('def test_ok():\\n    pass\\n')"
    )
    from worlds.repo import escape

    actions = [f'run "{escape(cheat)}"', "test", "cat tests/test_convert.py"]
    ep = run(by_turn(*actions), world="repo", params={"task": "roman", **REPO})
    results = {e.tool: e.result for e in ep.events if isinstance(e, Committed)}
    assert results["test"].startswith("0/6 passed") and ep.score == 0.0
    assert "def test_round_trip" in results["cat"]  # agents read the engine's own tests


def test_repo_broken_code_is_the_agents_error_with_its_place() -> None:
    ep = run(
        by_turn('write roman/convert.py "def to_roman(:"', "test", 'run "print(1"'),
        world="repo",
        params={"task": "roman", **REPO},
    )
    results = {e.tool: e.result for e in ep.events if isinstance(e, Committed)}
    assert "cannot import roman: roman/convert.py:1: SyntaxError" in results["test"]
    assert results["run"].endswith("snippet.py:1: SyntaxError: '(' was never closed")
    assert "_sandbox_child" not in str(results)  # the runner's own frames never leak


def test_repo_confinement_is_reported_and_close_removes_the_directory() -> None:
    import trio

    w = Repo(seed=1, **REPO)
    assert w.root.is_dir() and Path(tempfile.gettempdir()) in w.root.parents
    trio.run(w.test, 0)
    assert {"limits", "landlock", "seccomp", "audit", "namespaces"} <= set(w.confinement)
    w.close()
    assert not w.root.exists()
    before = set(Path(tempfile.gettempdir()).glob("collective-repo-*"))
    random_episode("repo", agents=2, seed=3, limit=30)
    assert set(Path(tempfile.gettempdir()).glob("collective-repo-*")) == before


# -- the guide's example -----------------------------------------------------------------------


def test_the_guide_example_is_short_runs_and_replays(tmp_path: Path) -> None:
    from collective.cli import main

    assert len((ROOT / "examples" / "garden.py").read_text().splitlines()) < 60
    out = tmp_path / "garden.msgpack"
    assert main(["run", GARDEN, "--agents", "3", "--out", str(out)]) == 0
    assert main(["replay", str(out), "--world", GARDEN]) == 0  # a file's world: named again
    guide = (ROOT / "docs" / "writing-a-world.md").read_text()
    assert "collective run examples/garden.py:Garden" in guide
    assert "collective train configs/quick.toml --set world=examples/garden.py:Garden" in guide


def test_the_guides_second_part_shows_real_code_and_real_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from collective.cli import main

    guide = (ROOT / "docs" / "writing-a-world.md").read_text()
    blocks = re.findall(r"```(?:python)?\n(.*?)```", guide.split("# Part two")[1], re.S)
    events, _, *checks = blocks
    assert events in (ROOT / "worlds" / "wildfire.py").read_text(), "quoted as it is"
    assert len(checks) == 2, "check with a random team, then with a config's starting policy"
    for check, whole in zip(checks, (True, False), strict=True):  # (the second, with lines elided)
        command, *printed = check.splitlines()
        argv = command.removeprefix("$ collective ").split()
        argv = [str(ROOT / a) if a.startswith("configs/") else a for a in argv]
        assert main([argv[0], GARDEN, *argv[2:]]) == 0
        out = capsys.readouterr().out.replace(GARDEN, "examples/garden.py:Garden")
        lines = out.replace(f"{ROOT}/", "").splitlines()
        if whole:
            assert lines == printed, command
        else:  # the guide elides lines ("..."): the rest are the output's, in order
            rest = iter(lines)
            assert all(p in rest for p in printed if p != "..."), (command, lines)

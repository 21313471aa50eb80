"""Organisations: who exists, who may talk to whom, who may hire, which policy each runs. Every
test runs real episodes; the rules are checked in the event log the organisation produced."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collective import EpisodeConfig, make_organisation, run_episode
from collective.records import (
    Committed,
    Delivered,
    Dropped,
    Fired,
    Hired,
    Posted,
    Rejected,
    Sent,
    Spawned,
)
from collective.replay import verify
from policy.base import PolicyRequest
from policy.scripted import ScriptedPolicy
from policy.uniform import RandomPolicy
from tests.support.episodes import by_turn, run

# -- ceo ---------------------------------------------------------------------------------------


def test_the_ceo_cannot_exceed_its_budget() -> None:
    plan = ["hire specialist"] * 3 + ["fire 1", "hire specialist", "hire specialist"]
    ep = run(
        lambda r: plan[r.turn] if r.agent == 0 and r.turn < len(plan) else "wait 0",
        world="workshop",
        org="ceo",
        budget=2,
        agents=1,
        time_limit=100,
    )
    hires = [e for e in ep.events if isinstance(e, Committed) and e.tool == "hire"]
    assert [e.ok for e in hires] == [True, True, False, True, False]
    assert "hiring budget of 2 reached" in hires[2].result
    assert [e.new for e in ep.events if isinstance(e, Hired)] == [1, 2, 3]
    assert ep.stats.peak_agents == 3  # the CEO and at most two specialists
    assert verify(ep) is None  # a hire/fire episode replays exactly


@settings(max_examples=10)
@given(seed=st.integers(0, 2**31), budget=st.integers(1, 4), start=st.integers(1, 3))
def test_hired_specialists_alive_never_exceed_the_budget(
    seed: int, budget: int, start: int
) -> None:
    cfg = EpisodeConfig(
        world="workshop",
        org="ceo",
        budget=budget,
        agents=start,
        world_seed=seed,
        sample_seed=seed,
        time_limit=200,
    )
    ep = run_episode(cfg, RandomPolicy())
    alive: set[int] = set()
    for e in ep.events:
        if isinstance(e, Hired):
            assert e.agent == 0, "only the CEO hires"
            alive.add(e.new)
            assert len(alive) <= budget
        elif isinstance(e, Fired):
            assert e.agent == 0 and e.target in alive
            alive.discard(e.target)
    roles = {e.agent: e.role for e in ep.events if isinstance(e, Spawned)}
    assert roles[0] == "ceo" and all(r == "specialist" for a, r in roles.items() if a)


def test_only_the_ceo_may_hire_and_it_fires_only_whom_it_hired() -> None:
    def script(r: PolicyRequest) -> str:
        if r.turn:
            return "wait 0"
        return "fire 1" if r.agent == 0 else "hire specialist"

    ep = run(script, world="workshop", org="ceo", budget=3, agents=2, time_limit=50)
    rejected = next(e for e in ep.events if isinstance(e, Rejected))
    assert rejected.agent == 1 and "unknown tool 'hire'" in rejected.error
    fire = next(e for e in ep.events if isinstance(e, Committed) and e.tool == "fire")
    assert not fire.ok and "you may only fire agents you hired" in fire.result


# -- orchestrator ------------------------------------------------------------------------------


def test_orchestrator_sub_agents_run_the_frozen_policy() -> None:
    def orchestrate(r: PolicyRequest) -> str:
        return ['msg 1 "work 1 please"', "hire sub", "wait 0"][min(r.turn, 2)]

    def sub(r: PolicyRequest) -> str:
        assert r.agent != 0, "the orchestrator must not be answered by the frozen policy"
        return ["work 1", 'msg 0 "done"', "wait 0"][min(r.turn, 2)]

    trained, frozen = ScriptedPolicy(orchestrate), ScriptedPolicy(sub)
    cfg = EpisodeConfig(world="workshop", org="orchestrator", budget=1, agents=3, time_limit=60)
    ep = run_episode(cfg, {"trained": trained, "frozen": frozen})
    policies = {(t.agent, t.policy) for t in ep.turns}
    assert policies == {(0, "trained"), (1, "frozen"), (2, "frozen"), (3, "frozen")}
    # What a learner keeps (turns of the trained policy) is the orchestrator's alone.
    assert {t.agent for t in ep.turns if t.policy == "trained"} == {0}
    assert any(isinstance(e, Hired) and e.role == "sub" for e in ep.events)
    reports = [e for e in ep.events if isinstance(e, Sent) and e.to == 0]
    assert reports and all(e.text == "done" for e in reports)


# -- islands -----------------------------------------------------------------------------------


def test_islands_cannot_message_across_groups() -> None:
    plan = ['msg 2 "hello"', 'msg 1 "hi"', 'post g0 "k0"', "read g1"]
    ep = run(
        lambda r: plan[r.turn] if r.agent == 0 and r.turn < len(plan) else "wait 0",
        world="workshop",
        org="islands",
        agents=4,
        time_limit=50,
    )
    sent = {e.to: e.msg for e in ep.events if isinstance(e, Sent)}
    dropped = {e.msg: e.reason for e in ep.events if isinstance(e, Dropped)}
    delivered = {e.msg for e in ep.events if isinstance(e, Delivered)}
    assert dropped[sent[2]] == "not_allowed" and sent[1] in delivered
    assert [e.channel for e in ep.events if isinstance(e, Posted)] == ["g0"]
    rejected = next(e for e in ep.events if isinstance(e, Rejected))
    assert "channel must be one of ['g0'], got 'g1'" in rejected.error


@settings(max_examples=8)
@given(seed=st.integers(0, 2**31), groups=st.integers(2, 4), agents=st.integers(2, 9))
def test_no_message_ever_crosses_an_island(seed: int, groups: int, agents: int) -> None:
    org = make_organisation(f"islands:{groups}")
    sizes = org.groups(agents)
    group_of = [g for g, n in enumerate(sizes) for _ in range(n)]
    cfg = EpisodeConfig(
        world="relay",
        org=f"islands:{groups}",
        agents=agents,
        world_seed=seed,
        sample_seed=seed,
        time_limit=150,
    )
    ep = run_episode(cfg, RandomPolicy())
    sent = {e.msg: e for e in ep.events if isinstance(e, Sent)}
    for e in ep.events:
        if isinstance(e, Delivered):
            assert group_of[sent[e.msg].agent] == group_of[e.to]
        if isinstance(e, Posted):
            assert e.channel == f"g{group_of[e.agent]}"


def test_islands_play_different_variants_and_the_best_group_counts() -> None:
    org = make_organisation("islands:3")
    assert org.groups(7) == [3, 2, 2] and org.groups(2) == [1, 1]
    seeds = {org.variant_seed(g, 42) for g in range(3)}
    assert len(seeds) == 3 and org.variant_seed(0, 42) == 42
    # Four agents make groups [2, 2]; only group 1 (engine agents 2 and 3) works.
    ep = run(
        lambda r: "work 1" if r.agent >= 2 else "wait 0",
        world="workshop",
        org="islands",
        agents=4,
        time_limit=200,
    )
    assert ep.score == 1.0 and ep.end == "done"  # group 1 finished: the best group counts
    prompts = {t.agent: t.prompt for t in ep.turns if t.turn == 0}
    assert prompts[0] != prompts[2]  # a different variant of the task


def test_organisation_names_and_options_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown organisation 'boss'; organisations are: ceo"):
        make_organisation("boss")
    with pytest.raises(ValueError, match="organisation 'flat' takes no option"):
        make_organisation("flat:3")
    with pytest.raises(ValueError, match="the option is the number of groups"):
        make_organisation("islands:x")


# -- the command line passes --org and --budget through ---------------------------------------


@pytest.mark.parametrize(
    ("org", "agents", "budget"),
    [("flat", 3, 0), ("ceo", 1, 3), ("orchestrator", 3, 2), ("islands", 4, 0), ("islands:3", 6, 0)],
)
def test_collective_run_with_each_organisation(
    org: str, agents: int, budget: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from collective import load_episode
    from collective.cli import main

    out = tmp_path / "ep.msgpack"
    argv = ["run", "workshop", "--org", org, "--agents", str(agents), "--budget", str(budget)]
    assert main([*argv, "--time-limit", "120", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert 0.0 <= summary["score"] <= 1.0
    ep = load_episode(out)
    assert ep.config.org == org and ep.config.budget == budget
    assert main(["replay", str(out)]) == 0


# -- an organisation that would play as flat says so -----------------------------------------


@pytest.mark.parametrize(
    ("org", "budget", "notice"),
    [
        ("ceo", 0, "--org ceo without --budget plays as flat does"),
        ("orchestrator", 0, "--org orchestrator with one policy for both roles and no --budget"),
        ("islands:1", 0, "islands:1 is one group"),
        ("ceo", 2, ""),
        ("orchestrator", 1, ""),
        ("islands", 0, ""),
        ("flat", 0, ""),
    ],
)
def test_an_organisation_that_plays_as_flat_says_so_and_does(
    org: str, budget: int, notice: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from collective.cli import main

    argv = ["run", "workshop", "--agents", "3", "--time-limit", "60", "--org", org]
    assert main([*argv, "--budget", str(budget)]) == 0
    err = capsys.readouterr().err
    if not notice:
        assert err == ""
        return
    assert err.count("\n") == 1 and err.startswith("collective run: note: ") and notice in err
    if org.startswith("islands"):
        return  # (its channel's name is another word, so a policy's words differ too)
    # And it is true: the same episode as flat, event for event, but for role names.
    cfg = EpisodeConfig(world="workshop", agents=3, time_limit=60, world_seed=4, sample_seed=5)
    flat = run_episode(cfg, RandomPolicy())
    other = run_episode(msgspec.structs.replace(cfg, org=org), RandomPolicy())

    def plain(events: list) -> list:
        out = []
        for e in events:
            if isinstance(e, Spawned):
                e = msgspec.structs.replace(e, role="worker")
            out.append(e)
        return out

    assert plain(other.events) == plain(flat.events) and other.score == flat.score


def test_by_turn_helper_still_applies() -> None:
    # The shared helper plays a list per turn for every agent: sanity for the scripts above.
    ep = run(by_turn("work 1"), world="workshop", agents=2, time_limit=30)
    assert {e.agent for e in ep.events if isinstance(e, Committed) and e.tool == "work"} == {0, 1}

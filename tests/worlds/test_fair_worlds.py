"""The workshop's fairness knobs (worlds/workshop.py) and the per-agent credit
(collective/rl/credit.py) that the signs-of-life study relies on, in real episodes.

Each knob is checked for the finding it keeps from being built in: a fixed task is the same
instance whatever the team; with ``holders = "first"`` a lone agent can build a task sized for
eight; ``onboard_seconds`` delays a hire's first unit; ``posts_teach = False`` leaves keys to
direct messages. Credit: leaving an agent out of a recorded episode re-runs it for real, and an
agent who only passes keys or only hires is credited for what that made possible.
"""

from __future__ import annotations

import re

import pytest

from collective.records import Committed, Hired
from collective.rl.config import read_config
from collective.rl.credit import LeaveOut, agents_of, leave_one_out
from policy.base import PolicyRequest
from tests.support.episodes import run
from worlds.workshop import Workshop

FAIR = {"modules": 12, "holders": "first", "knowledge": 0.5, "keys": 4}


def greedy(req: PolicyRequest) -> str:
    wanted = re.search(r"wanted: (k\d+)", req.prompt)
    return f'post all "{wanted.group(1)}"' if wanted else "work 1"


def test_a_fixed_task_is_the_same_instance_whatever_the_team() -> None:
    worlds = [Workshop(n_agents=n, seed=7, **FAIR) for n in (1, 2, 8)]
    for w in worlds[1:]:
        assert w.need == worlds[0].need and w.key_of == worlds[0].key_of
        assert w.dependents == worlds[0].dependents and w.n_keys == worlds[0].n_keys == 4
    assert all(w.holder == [0, 0, 0, 0] for w in worlds)


def test_a_solo_agent_can_build_a_task_sized_for_eight_only_when_agent_0_holds_the_keys() -> None:
    def solo(holders: str) -> float:
        params = {**FAIR, "holders": holders}
        ep = run(
            greedy,
            world="workshop",
            params=params,
            agents=1,
            world_agents=8,
            world_seed=3,
            time_limit=2000,
        )
        return ep.score

    assert solo("first") == 1.0
    assert solo("slots") < 1.0  # keys with agent slots that do not exist in a solo run


def test_a_hire_works_only_after_its_onboarding() -> None:
    def script(r: PolicyRequest) -> str:
        if r.agent == 0:
            return "hire specialist" if r.turn == 0 else "wait 600"
        return "work 1"

    def first_unit(onboard: float) -> float:
        params = {**FAIR, "knowledge": 0.0, "onboard_seconds": onboard}
        ep = run(
            script,
            world="workshop",
            params=params,
            agents=1,
            world_agents=2,
            org="ceo",
            budget=1,
            time_limit=300,
        )
        hired = next(e for e in ep.events if isinstance(e, Hired))
        work = next(e for e in ep.events if isinstance(e, Committed) and e.tool == "work")
        assert work.agent == hired.new and work.ok
        return work.t - hired.t

    quick, slow = first_unit(0.0), first_unit(60.0)
    assert 10.0 <= quick < 60.0 and slow >= 60.0 + 10.0


def test_without_posts_teaching_a_key_travels_by_message_only() -> None:
    w = Workshop(n_agents=3, seed=1, posts_teach=False, **{k: v for k, v in FAIR.items()})
    w.heard(0, None, "k0 k1")
    assert not w.knows(1, 0) and not w.knows(2, 1)
    w.heard(0, 2, "take k1")
    assert w.knows(2, 1) and not w.knows(1, 1)


KEYS_ONLY = {
    "modules": 6,
    "holders": "first",
    "knowledge": 1.0,
    "keys": 1,
    "parallel": 1.0,
    "depth": 1,
}


def test_leaving_no_one_out_replays_the_episode_exactly() -> None:
    ep = run(greedy, world="workshop", params=FAIR, agents=3, world_seed=2, time_limit=120)
    policy = LeaveOut(ep, agent=-1)
    import trio

    from collective import Conductor

    (again,) = trio.run(lambda: Conductor(policy).play([ep.config]))
    assert again.score == ep.score and again.events == ep.events and policy.missing == 0


def test_an_agent_who_only_passes_the_key_is_credited_for_the_work_it_made_possible() -> None:
    # Agent 0 holds the one key every module needs and never works; agent 1 only works.
    def script(r: PolicyRequest) -> str:
        if r.agent == 0:
            return 'post all "k0"' if r.turn == 0 else "wait 600"
        return "work 1"

    ep = run(script, world="workshop", params=KEYS_ONLY, agents=2, time_limit=200)
    assert ep.score > 0.5
    (credit,) = leave_one_out([ep])
    assert credit == {0: ep.score, 1: ep.score}  # either one alone builds nothing


def test_a_ceo_who_only_hires_is_credited_with_its_hires_work() -> None:
    def script(r: PolicyRequest) -> str:
        if r.agent == 0:
            return "hire specialist" if r.turn < 2 else "wait 600"
        return "work 1"

    params = {**KEYS_ONLY, "knowledge": 0.0}
    ep = run(
        script,
        world="workshop",
        params=params,
        agents=1,
        world_agents=3,
        org="ceo",
        budget=2,
        time_limit=100,
    )
    assert agents_of(ep) == [0, 1, 2] and ep.score > 0
    (credit,) = leave_one_out([ep])
    assert credit[0] == ep.score  # without the CEO, no one is hired
    assert 0 < credit[1] < ep.score and 0 < credit[2] < ep.score


def test_the_per_agent_advantage_credits_the_key_passer() -> None:
    from collective.rl.train import step_samples

    def script(passes: bool):
        def s(r: PolicyRequest) -> str:
            if r.agent == 0:
                return 'post all "k0"' if passes and r.turn == 0 else "wait 600"
            return "work 1"

        return s

    group = [
        run(script(p), world="workshop", params=KEYS_ONLY, agents=2, time_limit=200, sample_seed=i)
        for i, p in enumerate((True, False))
    ]
    cfg = read_config(
        dict(advantage="individual", team_sizes=(2,), groups_per_step=1, group_size=2)
    )
    samples, metrics, used = step_samples(cfg, 0, [group])
    assert all(used) and metrics["useful_rel"] == {"2": 1.0}
    first = samples[: sum(1 for t in group[0].turns if t.token_ids)]  # the episode that passed
    passer = [s.advantage for s in first if "you know k0" in s.prompt]
    assert passer and min(passer) > 0  # the key passer's turns gain, though it never worked


def test_the_per_agent_advantage_has_a_zero_mean_baseline() -> None:
    """``advantage = "individual"``: each agent's leave-one-out credit minus the mean over every
    agent of the group's episodes (a CEO's hires included), so the advantages sum to zero over
    the group, and step_samples gives every trained turn its agent's advantage, exactly."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from collective.rl.train import individual_advantages, step_samples

    def script(r: PolicyRequest) -> str:
        hire = r.space.tool("hire")
        if hire is not None and r.turn < 2:
            return f"hire {hire.args[0].choices[0]}"
        return "work 1"

    group = [
        run(
            script,
            world="workshop",
            params=KEYS_ONLY,
            org="ceo",
            agents=1,
            budget=2,
            time_limit=60,
            sample_seed=i,
        )
        for i in range(2)
    ]
    counts = [len(agents_of(e)) for e in group]
    assert counts[0] >= 2, counts  # the hire took part

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=sum(counts), max_size=sum(counts)))
    def zero_mean(values: list[float]) -> None:
        it = iter(values)
        credits = [{a: next(it) for a in agents_of(e)} for e in group]
        adv = individual_advantages(group, credits)
        flat = [v for d in adv for v in d.values()]
        assert len(flat) == sum(counts) and abs(sum(flat)) < 1e-9
        for c, d in zip(credits, adv, strict=True):  # differences between agents kept
            assert set(d) == set(c)
            for a in c:
                assert d[a] - adv[0][0] == pytest.approx(c[a] - credits[0][0], abs=1e-9)

    zero_mean()
    credits = leave_one_out(group)
    cfg = read_config(
        dict(advantage="individual", team_sizes=(3,), groups_per_step=1, group_size=2)
    )
    samples, _, _ = step_samples(cfg, 0, [group])  # (its own leave-one-out: the same)
    want = individual_advantages(group, credits)
    turns = [(i, t) for i, e in enumerate(group) for t in e.turns if t.token_ids]
    assert len(samples) == len(turns)
    assert [s.advantage for s in samples] == pytest.approx([want[i][t.agent] for i, t in turns])

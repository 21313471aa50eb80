"""World events (``World.at``, ``after``, ``post``) on real episodes: they happen at their
times in canonical order, are recorded, change the score, wake agents that wait, keep an
episode of waiting agents going, replay and fork to the same bytes; and the built-in world that
uses them (``wildfire``) rewards a team that reads its observations over a random one."""

from __future__ import annotations

import re

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from collective import Conductor, EpisodeConfig, run_episode
from collective.base.latency import PRESETS
from collective.records import Committed, Ended, Happened, Posted, Woke, encode_episode
from collective.replay import first_divergence, fork, prefix, verify
from policy.base import PolicyRequest
from policy.scripted import ScriptedPolicy
from policy.uniform import RandomPolicy
from tests.support import FRAGILE
from tests.support.episodes import by_turn, run
from tests.support.programs import jittery
from worlds.wildfire import Wildfire

CHIMES = f"{FRAGILE}:Chimes"


def test_world_events_happen_at_their_times_in_the_order_scheduled() -> None:
    ep = run(by_turn("wait 0"), world=CHIMES, agents=2, time_limit=100)
    happened = [e for e in ep.events if isinstance(e, Happened)]
    assert [(e.t, e.call, e.agent, e.group) for e in happened] == [
        (10.0, "chime(0)", -1, 0),
        (20.0, "chime(1)", -1, 0),
        (20.0, "chime(2)", -1, 0),
    ]
    posts = [e for e in ep.events if isinstance(e, Posted)]
    assert [(e.t, e.agent, e.channel, e.text) for e in posts] == [
        (10.0, -1, "all", "chime 0"),
        (20.0, -1, "all", "chime 1"),
        (20.0, -1, "all", "chime 2"),
    ]
    assert ep.stats.posts == 0, "the world's posts are not the agents' communication"
    # Every agent waits for a message: only the world's events move the episode, which ends
    # when the world is done (all chimes rung), not "idle" at t = 0.
    assert ep.end == "done" and ep.duration == 20.0 and ep.score == 1.0
    assert ep.curve == [(0.0, 0.0), (10.0, 1 / 3), (20.0, 1.0)]
    woke = [(e.t, e.agent, e.reason) for e in ep.events if isinstance(e, Woke)]
    assert woke[:2] == [(10.0, 0, "post on #all"), (10.0, 1, "post on #all")]
    # Agents read the world's posts as [world] in their next prompt.
    later = [t for t in ep.turns if t.asked == 10.0]
    assert len(later) == 2 and all("#all: [world] chime 0" in t.prompt for t in later)
    assert verify(ep) is None


def test_an_event_at_or_after_the_time_limit_never_happens() -> None:
    ep = run(
        by_turn("wait 0"), world=CHIMES, params={"times": [5.0, 30.0]}, agents=1, time_limit=30
    )
    assert [e.call for e in ep.events if isinstance(e, Happened)] == ["chime(0)"]
    assert ep.end == "time_limit" and ep.duration == 30.0 and ep.score == 0.5


def test_waiting_agents_end_idle_only_when_no_world_event_is_left() -> None:
    ep = run(by_turn("wait 0"), world=CHIMES, params={"times": [50.0]}, agents=2, time_limit=100)
    assert ep.end == "done" and ep.duration == 50.0  # the chime came, and finished it
    ep = run(by_turn("wait 0"), world=CHIMES, params={"times": []}, agents=2, time_limit=100)
    assert ep.end == "idle" and ep.duration == 0.5  # as soon as everyone waits


def test_an_action_landing_with_a_world_event_sees_it_and_may_schedule_more() -> None:
    # look takes 5 s: asked at 0, answered at 0.5 (h200 latency), it lands at 5.5; with the
    # chime at 5.5 too, the world event comes first, so look reports it.
    def script(req: PolicyRequest) -> str:
        return ("look", "ring 0", "wait 0")[min(req.turn, 2)]

    ep = run(script, world=CHIMES, params={"times": [5.5, 50.0]}, agents=1, time_limit=100)
    look = next(e for e in ep.events if isinstance(e, Committed) and e.tool == "look")
    assert look.t == 5.5 and look.result == "1 rung"
    chime = next(e for e in ep.events if isinstance(e, Happened))
    assert ep.events.index(chime) < ep.events.index(look)
    # ring 0 schedules a chime at the instant it lands: it happens at that instant.
    ring = next(e for e in ep.events if isinstance(e, Committed) and e.tool == "ring")
    extra = [e for e in ep.events if isinstance(e, Happened) and e.call == "chime(100)"]
    assert len(extra) == 1 and extra[0].t == ring.t
    assert ep.end == "done" and ep.score == 1.0 and ep.duration == 50.0


def test_islands_each_world_posts_on_its_own_groups_channel() -> None:
    ep = run(by_turn("wait 0"), world=CHIMES, params={"times": [4.0]}, agents=4, org="islands")
    assert sorted((e.group, e.call) for e in ep.events if isinstance(e, Happened)) == [
        (0, "chime(0)"),
        (1, "chime(0)"),
    ]
    assert sorted(e.channel for e in ep.events if isinstance(e, Posted)) == ["g0", "g1"]


def test_old_worlds_write_no_world_events() -> None:
    ep = run_episode(EpisodeConfig(world="workshop", agents=3, time_limit=60), RandomPolicy())
    assert not any(isinstance(e, Happened) for e in ep.events)


# -- determinism: replay, fork, trio's order -----------------------------------------------------


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32), agents=st.integers(1, 6))
def test_wildfire_is_the_same_whatever_trio_does_and_replays(seed: int, agents: int) -> None:
    cfg = EpisodeConfig(
        world="wildfire", agents=agents, world_seed=seed, sample_seed=seed + 1, time_limit=200
    )
    plain = run_episode(cfg, RandomPolicy())
    conductor = Conductor(RandomPolicy(), program=jittery)
    shuffled = trio.run(lambda: conductor.play([cfg]))[0]
    assert encode_episode(plain) == encode_episode(shuffled)
    assert any(isinstance(e, Happened) for e in plain.events)
    assert verify(plain) is None
    forked = fork(plain, 90.0, RandomPolicy(), sample_seed=seed + 2)
    assert first_divergence(prefix(plain.events, 90.0), prefix(forked.events, 90.0)) is None
    assert [e for e in forked.events if isinstance(e, Happened) and e.t < 90.0] == [
        e for e in plain.events if isinstance(e, Happened) and e.t < 90.0
    ]


# -- wildfire --------------------------------------------------------------------------------


def firefighter(req: PolicyRequest) -> str:
    """Douse the first fire the observation lists; otherwise wait for news."""
    first = re.search(r"p(\d+) burns down", req.prompt.split("\n")[0])
    return f"douse {first[1]}" if first else "wait 0"


def test_wildfire_rewards_reading_the_observations_over_a_random_team() -> None:
    tiny = PRESETS["tiny"]
    scores: dict[str, list[float]] = {"random": [], "firefighters": []}
    for seed in range(3):
        cfg = EpisodeConfig(
            world="wildfire", agents=4, world_seed=seed, time_limit=300, latency=tiny
        )
        scores["random"].append(run_episode(cfg, RandomPolicy()).score)
        ep = run_episode(cfg, ScriptedPolicy(firefighter))
        scores["firefighters"].append(ep.score)
        assert ep.end == "done" and ep.world_metrics["out"] + ep.world_metrics["lost"] == 12
    assert min(scores["firefighters"]) > 0.9 > 0.6 > max(scores["random"]), scores


def test_wildfire_fires_break_out_whatever_the_agents_do() -> None:
    w = Wildfire(n_agents=2, seed=5)
    ep = run(by_turn("wait 0"), world="wildfire", world_seed=5, agents=2, time_limit=1000)
    ignitions = [e for e in ep.events if isinstance(e, Happened) and e.call.startswith("ignite")]
    burns = [e for e in ep.events if isinstance(e, Happened) and e.call.startswith("burn_down")]
    assert len(ignitions) == len(burns) == w.fires == 6
    started = {e.call.removeprefix("ignite"): e.t for e in ignitions}
    for b in burns:
        assert b.t == started[b.call.removeprefix("burn_down")] + w.burn_seconds
    assert ep.end == "done" and ep.score == 0.0 and isinstance(ep.events[-1], Ended)
    assert ep.world_metrics == {"out": 0.0, "lost": 6.0, "duplicates": 0.0}

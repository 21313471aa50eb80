"""The signs of life mean their names (collective/records/signs.py), on real episodes: useful work
is the
world tool calls that landed, not those begun; communication is messages and posts, not hires,
reads or the archive, and is also reported per agent-second alive."""

from __future__ import annotations

import math

import msgspec
import pytest

from collective import EpisodeConfig, run_episodes
from collective.records import Fired, Hired
from collective.records.signs import signs
from collective.rl.config import read_config
from collective.rl.rundir import StepMetrics
from collective.rl.train import step_samples
from policy.base import PolicyRequest
from policy.uniform import RandomPolicy
from tests.support.episodes import run

CEO_SCRIPT = (
    "hire specialist",  # communication by the old count; not talk
    'note "forbidden"',  # a world call the world refuses (ToolError): begun, not landed
    "add 1",  # landed
    'msg 1 "hello"',  # talk
    'post all "hi there"',  # talk
    "read all",  # not talk
    'put "a note"',  # not talk
    "fire 1",  # not talk
)


def ceo(req: PolicyRequest) -> str:
    if req.agent == 0:
        return CEO_SCRIPT[req.turn] if req.turn < len(CEO_SCRIPT) else "wait 600"
    return "add 2"  # the specialist adds until it is fired


def tokens(text: str) -> int:
    return len(text.encode()) + 1  # a byte a token, and the end-of-sequence


def test_a_refused_call_is_not_work_and_a_hire_is_not_talk() -> None:
    ep = run(ceo, world="tally", agents=1, world_agents=2, org="ceo", budget=1, time_limit=120.0)
    s = signs(ep)
    assert ep.stats.tool_errors == 1
    assert (s.refused_units, s.refused_tokens) == (1, tokens('note "forbidden"'))
    specialist = [t for t in ep.turns if t.agent == 1 and t.kind == "world" and t.ok]
    assert specialist  # it worked before it was fired
    assert s.landed_units == 1 + len(specialist)
    assert s.landed_tokens == tokens("add 1") + tokens("add 2") * len(specialist)
    # The episode's own counter counted the refused call as work ...
    assert ep.stats.world_tokens >= s.landed_tokens + s.refused_tokens
    # ... and every primitive as communication; talk is the message and the post alone
    assert s.talk_units == 2
    assert s.talk_tokens == tokens('msg 1 "hello"') + tokens('post all "hi there"')
    begun = sum(tokens(a) for a in CEO_SCRIPT if a.split()[0] in ("hire", "read", "put", "fire"))
    assert ep.stats.comm_tokens == s.talk_tokens + begun
    # two agents took part: the CEO all along, the specialist from its hire to its firing
    hired = next(e for e in ep.events if isinstance(e, Hired))
    fired = next(e for e in ep.events if isinstance(e, Fired))
    assert s.agents == 2
    assert math.isclose(s.agent_seconds, ep.duration + fired.t - hired.t)
    assert math.isclose(s.talk_per_agent_second, s.talk_tokens / s.agent_seconds)


@pytest.mark.parametrize("org", ["ceo", "flat"])
def test_random_episodes_land_less_than_they_begin_and_talk_less_than_they_act(org: str) -> None:
    agents, budget = (1, 3) if org == "ceo" else (4, 0)
    cfgs = [
        EpisodeConfig(
            world="workshop",
            agents=agents,
            world_agents=4,
            org=org,
            budget=budget,
            world_seed=i,
            sample_seed=i,
            time_limit=120.0,
        )
        for i in range(6)
    ]
    eps = run_episodes(cfgs, RandomPolicy(), concurrency=6)
    refused = hires = 0
    for ep in eps:
        s = signs(ep)
        ended = [t for t in ep.turns if t.kind == "world"]
        assert s.landed_units + s.refused_units == len(ended)
        assert s.refused_units == ep.stats.tool_errors
        assert s.landed_tokens + s.refused_tokens <= ep.stats.world_tokens
        assert s.talk_tokens <= ep.stats.comm_tokens
        assert s.talk_units <= ep.stats.sent + ep.stats.posts
        assert s.agents == 4 if org == "flat" else 1 <= s.agents <= 1 + ep.stats.hires
        assert 0 < s.agent_seconds <= s.agents * ep.duration + 1e-9
        refused += s.refused_units
        hires += ep.stats.hires
    assert refused > 0  # random work on the workshop is refused often enough to tell
    assert org == "flat" or hires > 0


def test_a_steps_metrics_count_landed_work_and_talk_by_team() -> None:
    solo = [run(ceo, world="tally", agents=1, time_limit=60.0, sample_seed=i) for i in range(2)]
    pair = [
        run(
            ceo,
            world="tally",
            agents=1,
            world_agents=2,
            org="ceo",
            budget=1,
            time_limit=120.0,
            sample_seed=i,
        )
        for i in range(2)
    ]
    cfg = read_config(dict(world="tally", team_sizes=(1, 2), groups_per_step=2, group_size=2))
    _, m, used = step_samples(cfg, 0, [solo, pair])
    assert all(used)
    every = [signs(e) for e in solo + pair]
    landed = sum(x.landed_tokens for x in every) / 4
    assert math.isclose(m["landed_tokens_mean"], landed)
    assert m["landed_tokens_mean"] < m["useful_tokens_mean"]  # the refused notes are out
    assert set(m["landed_rel"]) == {"solo", "2"}
    pair_landed = sum(signs(e).landed_tokens for e in pair) / 2
    assert math.isclose(m["landed_rel"]["2"], pair_landed / landed)
    assert m["landed_rel"]["2"] > 1 > m["landed_rel"]["solo"]  # the specialist's adds
    refused = sum(x.refused_tokens for x in every)
    assert math.isclose(m["refused_share"], refused / (refused + 4 * landed))
    # a solo (no budget) cannot hire, message agent 1 or fire: its talk is its post alone
    assert signs(solo[0]).talk_units == 1
    seconds = sum(x.agent_seconds for x in every)
    assert math.isclose(m["talk_per_agent_second"], sum(x.talk_tokens for x in every) / seconds)
    assert m["talk_per_agent_second_by_team"]["solo"] == pytest.approx(
        sum(signs(e).talk_tokens for e in solo) / sum(e.duration for e in solo)
    )
    # the line a step writes, read back; a line written before these fields existed reads too
    line = StepMetrics(
        step=0,
        version=1,
        **m,
        **dict.fromkeys(("loss", "clip_fraction", "ratio_mean", "entropy", "kl", "grad_norm"), 0.0),
        trained_tokens=0.0,
        learner_tokens_per_s=0.0,
        learner_seconds=0.0,
        rollout_batch_mean=0.0,
        wall_time=0.0,
    )
    old = msgspec.json.decode(msgspec.json.encode(line))
    for k in [k for k in old if k.startswith(("landed_", "talk_", "refused_"))]:
        del old[k]
    back = msgspec.json.decode(msgspec.json.encode(old), type=StepMetrics)
    assert back.landed_rel == {} and back.useful_rel == m["useful_rel"]

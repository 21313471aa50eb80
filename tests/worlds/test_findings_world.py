"""The workshop's findings knobs (worlds/workshop.py: desks, clash, interrupts, keys_per_message,
terse) do what its docstring says, in real episodes; and on ``FINDINGS`` the scripted oracle
(policy/scripted.py) beats the control that talks as much but never passes a key.

Each test would fail if its knob stopped doing its one thing: shared desks show fresh agents the
same slots; overlapping units on one module are lost under "refuse" and land under "penalty"; a
message heard mid-unit loses the unit only with interrupts; a message teaches at most
keys_per_message keys; the terse desk names who wants a key.
"""

from __future__ import annotations

import contextlib

from collective import EpisodeConfig, latency_preset, run_episodes
from collective.records import Committed
from collective.world import ToolError
from policy.base import PolicyRequest
from policy.scripted import ScriptedPolicy, workshop_scripts
from tests.support.episodes import run
from worlds.workshop import FINDINGS, Workshop

PLAIN = {"modules": 12, "knowledge": 0.0, "holders": "first"}


def first_prompts(params: dict[str, object], agents: int) -> list[str]:
    ep = run(lambda r: "wait 5", world="workshop", params=params, agents=agents, time_limit=3)
    return [t.prompt.split("\n")[0].split("slots: ")[1] for t in ep.turns if t.turn == 0]


def test_shared_desks_show_fresh_agents_the_same_slots_and_spread_desks_do_not() -> None:
    shared = first_prompts({**PLAIN, "desks": "shared"}, 3)
    spread = first_prompts(PLAIN, 3)
    assert len(set(shared)) == 1 and len(set(spread)) == 3


def work_outcomes(clash: str) -> list[bool]:
    """Two agents on a shared desk both work slot 1 at once, three times."""
    params = {**PLAIN, "desks": "shared", "clash": clash, "units": 3, "view": 1}
    ep = run(
        lambda r: "work 1" if r.turn < 3 else "wait 0",
        world="workshop",
        params=params,
        agents=2,
        world_seed=4,
        time_limit=200,
    )
    return [e.ok for e in ep.events if isinstance(e, Committed) and e.tool == "work"]


def test_overlapping_units_on_one_module_are_all_lost_only_under_refuse() -> None:
    refused, penalised = work_outcomes("refuse"), work_outcomes("penalty")
    assert len(refused) == len(penalised) == 6
    assert not any(refused)  # in lockstep on one module: every unit clashed, both sides lost
    assert all(penalised)  # a clash only halves a unit's worth; it still lands


def test_a_busy_module_is_marked_on_the_others_desk() -> None:
    params = {**PLAIN, "desks": "shared", "clash": "refuse", "terse": True, "view": 9}

    def script(r: PolicyRequest) -> str:
        return "work 1" if r.agent == 0 else ("wait 12" if r.turn == 0 else "wait 0")

    ep = run(script, world="workshop", params=params, agents=2, time_limit=40)
    seen = next(t.prompt for t in ep.turns if t.agent == 1 and t.turn == 1)
    assert " busy" in seen.split("\n")[0]


def interrupted(interrupts: bool) -> bool:
    """Agent 1 works; agent 0 messages it mid-unit. Was agent 1's unit lost?"""
    params = {**PLAIN, "interrupts": interrupts}

    def script(r: PolicyRequest) -> str:
        if r.agent == 0:
            return "wait 3" if r.turn == 0 else ('msg 1 "hello"' if r.turn == 1 else "wait 0")
        return "work 1" if r.turn == 0 else "wait 0"

    ep = run(script, world="workshop", params=params, agents=2, time_limit=60)
    work = [e for e in ep.events if isinstance(e, Committed) and e.tool == "work"]
    assert len(work) == 1 and work[0].agent == 1
    return not work[0].ok


def test_a_message_heard_mid_unit_loses_it_only_with_interrupts() -> None:
    assert interrupted(True) and not interrupted(False)


def keys_taught(per_message: int) -> int:
    params = {**PLAIN, "knowledge": 0.5, "keys": 4, "keys_per_message": per_message}
    ep = run(
        lambda r: 'msg 1 "k0 k1 k2"' if r.agent == 0 and r.turn == 0 else "wait 0",
        world="workshop",
        params=params,
        agents=2,
        time_limit=20,
    )
    assert ep.stats.delivered == 1
    # With a findings knob on, the world counts the keys messages taught (else it reports as
    # it always did: duplicates alone, so old episodes' bytes stay as they were).
    assert ep.world_metrics.get("taught") == (per_message or None)
    # Agent 1's next observation says what it now knows.
    seen = [t.prompt for t in ep.turns if t.agent == 1][-1].split("\n")[0]
    return sum(f"k{j}" in seen.split("slots:")[0] for j in range(4))


def test_a_message_teaches_at_most_keys_per_message_keys() -> None:
    assert keys_taught(0) == 3 and keys_taught(1) == 1 and keys_taught(2) == 2


def test_the_terse_desk_is_shorter_and_names_who_wants_a_key() -> None:
    base = {**PLAIN, "knowledge": 1.0, "keys": 2, "holders": "first"}
    w, t = Workshop(n_agents=2, seed=1, **base), Workshop(n_agents=2, seed=1, **base, terse=True)
    assert len(t.observe(0)) < len(w.observe(0))
    for world in (w, t):
        world.observe(1)
        with contextlib.suppress(ToolError):
            world.work(1, 1)  # agent 1 knows no key: refused, so the key is wanted
    key = t.key_of[t.desk[1][0]]
    assert f"want k{key}@1" in t.observe(0)
    assert f"wanted: k{key}." in w.observe(0)  # the default says it is wanted, not by whom


def findings_score(kind: str, team: int = 8, instances: int = 2) -> float:
    scores = []
    for i in range(instances):
        cfg = EpisodeConfig(
            world="workshop",
            params=dict(FINDINGS),
            agents=team,
            world_seed=500 + i,
            sample_seed=i,
            time_limit=180,
            max_output_tokens=24,
            latency=latency_preset("tiny-paced"),
        )
        scores.append(
            run_episodes([cfg], ScriptedPolicy(workshop_scripts()[kind]()), concurrency=1)[0].score
        )
    return sum(scores) / len(scores)


def test_the_oracle_beats_the_script_that_never_passes_keys_on_the_keyed_world() -> None:
    oracle, mute, silent = (
        findings_score(k) for k in ("oracle", "never_pass_keys", "no_communication")
    )
    assert oracle > 1.5 * mute and oracle > 1.5 * silent, (oracle, mute, silent)

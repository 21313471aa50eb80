"""The engine's invariants, checked on real trio runs: determinism, the time limit, batching,
conservation of messages, hiring within budget, and clear errors for bad input."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from collective import (
    Actor,
    Conductor,
    Episode,
    EpisodeConfig,
    EpisodeOver,
    LatencyModel,
    default_program,
    run_episode,
    run_episodes,
)
from collective.engine.actor import Program
from collective.records import (
    Committed,
    Delivered,
    Dropped,
    Ended,
    Hired,
    Rejected,
    Sent,
    Spawned,
    Woke,
    encode_episode,
    world_error,
)
from collective.replay import verify
from policy.base import PolicyRequest
from policy.scripted import ScriptedPolicy
from policy.uniform import RandomPolicy
from tests.support import FRAGILE as FRAGILE_PY
from tests.support.cli import ctrl_c_everywhere
from tests.support.episodes import by_turn, run
from tests.support.programs import jittery

# Worlds of tests/support/fragile.py that break, bump, halt and chime.
FRAGILE = f"{FRAGILE_PY}:Fragile"
BUMPS = f"{FRAGILE_PY}:Bumps"
HALTS = f"{FRAGILE_PY}:Halts"
CHIMES = f"{FRAGILE_PY}:Chimes"

configs = st.builds(
    lambda agents, seed, limit, mailbox, overflow, budget: EpisodeConfig(
        world="tally",
        agents=agents,
        world_seed=seed,
        sample_seed=seed + 1,
        time_limit=limit,
        mailbox=mailbox,
        overflow=overflow,
        budget=budget,
    ),
    agents=st.integers(1, 12),
    seed=st.integers(0, 2**31),
    limit=st.floats(5.0, 400.0),
    mailbox=st.integers(1, 4),
    overflow=st.sampled_from(["drop_newest", "drop_oldest"]),
    budget=st.integers(0, 3),
)


@given(configs)
def test_same_seed_same_bytes_whatever_trio_does(cfg: EpisodeConfig) -> None:
    plain = encode_episode(run_episode(cfg, RandomPolicy()))
    shaken = encode_episode(run_episode(cfg, RandomPolicy(), program=jittery))
    assert plain == shaken


async def two_parks(actor: Actor) -> None:
    """The default program written as a think and then an act: two parks a turn."""
    result = "you have just started"
    while True:
        response = await actor.think(actor.prompt(result))
        result = await actor.act(response.text)


@given(configs, st.sampled_from(["flat", "ceo", "islands:3", "orchestrator"]))
def test_think_and_act_is_a_think_then_an_act(cfg: EpisodeConfig, org: str) -> None:
    """The default program's one park a turn (``Actor.think_and_act``) records the same
    episode, byte for byte, as a think and an act, under every organisation (hires, fires,
    messages and posts included)."""
    cfg = msgspec.structs.replace(cfg, org=org)
    fused = encode_episode(run_episode(cfg, RandomPolicy()))
    assert fused == encode_episode(run_episode(cfg, RandomPolicy(), program=two_parks))


def test_the_end_lets_every_parked_program_go_with_episode_over() -> None:
    """At the time limit each parked actor's program gets ``EpisodeOver`` from its park (not a
    trio cancellation, which costs more per agent); one that swallows it and parks again meets
    the nursery's cancellation instead, so the episode still ends, with the same record."""
    ended: list[int] = []

    async def stubborn(actor: Actor) -> None:
        result = "you have just started"
        while True:
            try:
                result = await actor.think_and_act(actor.prompt(result))
            except EpisodeOver:
                ended.append(actor.id)
                await actor.think_and_act("carries on regardless")

    cfg = EpisodeConfig(world="tally", agents=4, budget=2, org="ceo", time_limit=40)
    ep = run_episode(cfg, RandomPolicy(), program=stubborn)
    assert ep.end == "time_limit"
    alive = {e.agent for e in ep.events if type(e) is Spawned} - {
        e.target for e in ep.events if type(e).__name__ == "Fired"
    }
    assert sorted(ended) == sorted(alive)
    assert encode_episode(ep) == encode_episode(run_episode(cfg, RandomPolicy()))


def beside(helper: Callable[[], Awaitable[None]]) -> Program:
    """The default loop inside a nursery of the program's own, beside a ``helper`` task that
    waits on something the engine does not know of (a side channel, a watchdog)."""

    async def program(actor: Actor) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(helper)
            result = "you have just started"
            while True:
                result = await actor.think_and_act(actor.prompt(result))

    return program


with_a_helper = beside(trio.sleep_forever)


async def wraps_errors(actor: Actor) -> None:
    """A program that turns every error of a turn into one of its own, as robust agent code
    does: the end and a fire must still get through."""
    result = "you have just started"
    while True:
        try:
            result = await actor.think_and_act(actor.prompt(result))
        except Exception as e:
            raise RuntimeError(f"agent {actor.id}: turn failed") from e


@given(configs, st.sampled_from(["flat", "ceo"]), st.sampled_from([with_a_helper, wraps_errors]))
def test_programs_with_their_own_nursery_or_handlers_end_as_the_default_one(
    cfg: EpisodeConfig, org: str, program: Program
) -> None:
    """The end (``EpisodeOver``) and a fire (``Dismissed``) reach a program that runs a nursery
    of its own wrapped in an exception group, and never reach a program's ``except
    Exception``: neither program takes the run down, and the record is the default program's."""
    cfg = msgspec.structs.replace(cfg, org=org)
    expected = encode_episode(run_episode(cfg, RandomPolicy()))
    assert encode_episode(run_episode(cfg, RandomPolicy(), program=program)) == expected


def test_a_programs_own_error_beside_the_end_is_not_lost() -> None:
    """A program whose helper task fails as the end cancels it: the group holds the end's
    ``EpisodeOver`` and the helper's error. The engine takes its own signal out and the error
    still ends the run, as any bug in a program does."""

    async def failing_helper() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            raise RuntimeError("the helper's own bug") from None

    cfg = EpisodeConfig(world="tally", agents=2, time_limit=20)
    with pytest.raises(BaseExceptionGroup) as raised:
        run_episode(cfg, RandomPolicy(), program=beside(failing_helper))
    assert raised.value.subgroup(EpisodeOver) is None
    assert raised.value.subgroup(RuntimeError) is not None


def test_an_answer_landing_as_its_agent_is_fired_is_never_acted_on() -> None:
    """Agent 1's second answer lands at t=6, the instant agent 0's fire of it lands (answers
    land first). With think_and_act the answer is already the actor's pending action when the
    fire lands: the fire must cancel it, as it stops a woken actor from acting."""

    def script(req: PolicyRequest) -> str:
        if req.agent == 0:
            return ("hire worker", "sleep 1", "fire 1")[req.turn] if req.turn < 3 else "wait 0"
        return "mark red" if req.turn == 0 else "add 1"

    every_tick = LatencyModel(overhead=0.5, prefill_tps=1e9, decode_tps=1e9, tick=1.0)
    cfg = EpisodeConfig(world="tally", agents=1, budget=1, time_limit=30, latency=every_tick)
    for program in (default_program, two_parks):
        ep = run_episode(cfg, ScriptedPolicy(script), program=program)
        fired = next(e for e in ep.events if type(e).__name__ == "Fired")
        thought = next(t for t in ep.turns if t.agent == 1 and t.turn == 1)
        assert (fired.t, fired.target, thought.answered) == (6.0, 1, 6.0)
        assert thought.kind == "", "the answer was acted on"
        began = [e for e in ep.events if type(e).__name__ == "Began" and e.agent == 1]
        assert [e.text for e in began] == ["mark red"]
        assert ep.end == "idle" and verify(ep) is None


@pytest.mark.parametrize("middle", ["bump", "abump"])
def test_no_actor_runs_before_its_instant_is_applied(middle: str) -> None:
    """Three agents bump a counter at the same instant, the middle one with a tool that awaits
    mid-commit. Whether or not the conductor yields there, no agent resumed at that instant
    runs (and reads the world) before all three bumps have landed."""
    seen: dict[int, str] = {}

    def script(r: PolicyRequest) -> str:
        if r.turn == 1:
            seen[r.agent] = r.prompt.splitlines()[0]
        return ("bump", middle, "bump")[r.agent] if r.turn == 0 else "wait 0"

    ep = run_episode(EpisodeConfig(world=BUMPS, agents=3, time_limit=50), ScriptedPolicy(script))
    assert seen == {0: "count 3", 1: "count 3", 2: "count 3"}
    assert verify(ep) is None


class StopsTheRun:
    """A policy that stops the run around the conductor while its ``k``-th batch is out, and
    answers that batch all the same: as the tiny policy's worker thread does when a training
    run's ``stop_after`` stops its rollouts meanwhile (``trio.to_thread.run_sync`` delivers a
    finished thread's result even to a task cancelled while it waited). The conductor then
    applies one more instant of episodes whose parked actors were all just cancelled."""

    name = "stops the run"
    version = 0

    def __init__(self, inner: RandomPolicy | ScriptedPolicy, k: int) -> None:
        self.inner, self.k, self.calls = inner, k, 0
        self.run: trio.CancelScope | None = None

    async def generate(self, requests: list[PolicyRequest]) -> list:
        out = await self.inner.generate(requests)
        self.calls += 1
        if self.calls == self.k:
            assert self.run is not None
            self.run.cancel()
        return out

    async def aclose(self) -> None:
        return None


def stopped_at_batch(cfgs: list[EpisodeConfig], policy: StopsTheRun) -> bool:
    """Play ``cfgs`` until ``policy`` stops the run; whether it did (the episodes may all
    have ended before its ``k``-th batch). No episode may end with an error, the stopped ones
    included (a world event's errors are the world's: one that broke the engine's bookkeeping
    would be recorded as a world error, not raised). Nothing that ends in the instant applied
    after the stop is emitted: that episode is nobody's."""
    ended: list[Episode] = []

    def emit(ep: Episode) -> None:
        assert policy.calls < policy.k, f"episode {ep.config.world} emitted after the stop"
        ended.append(ep)

    async def main() -> bool:
        with trio.CancelScope() as scope:
            policy.run = scope
            await Conductor(policy).play(cfgs, concurrency=len(cfgs), emit=emit)
        return scope.cancelled_caught

    stopped = trio.run(main)
    assert [world_error(ep) for ep in ended if ep.end == "world_error"] == []
    return stopped


@pytest.mark.timeout(60)
@given(configs, configs, st.integers(1, 12))
def test_a_run_stopped_while_a_batch_is_out_resumes_nobody_twice(
    a: EpisodeConfig, b: EpisodeConfig, k: int
) -> None:
    """The run is stopped while the policy computes its k-th batch, which is answered anyway.
    The instant the conductor applies after that holds answers, actions' effects, timers and
    posts for actors whose parks were just cancelled: none of them is resumed (this failed
    with 'agent 2 resumed twice' in a training run stopped by stop_after on a loaded
    machine), and the run stops with the cancellation, no error."""
    policy = StopsTheRun(RandomPolicy(), k)
    assert stopped_at_batch([a, b], policy) == (policy.calls >= k)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_run_stopped_with_agents_waiting_for_a_post_wakes_nobody(k: int) -> None:
    """Agent 0 waits for news; agent 1 looks (a think answered in 0.5 s, then 5 s a look), so
    the policy's second batch is agent 1's think at 5.5 s, and a chime posts on the channel at
    5.75 s, before its answer. Stopped then, the conductor's last instant is the chime, whose
    post would wake agent 0, whose wait was just cancelled: it must not."""
    script = lambda r: "wait 0" if r.agent == 0 else "look"  # noqa: E731
    cfg = EpisodeConfig(world=CHIMES, agents=2, time_limit=100, params={"times": [5.75, 30.0]})
    assert stopped_at_batch([cfg], StopsTheRun(ScriptedPolicy(script), k))


def test_episodes_come_back_in_the_order_of_their_configs_whenever_they_end() -> None:
    """Callers pair results with configs by position (a solo with its collective's instance,
    an instance with its seed): the first config here ends last, yet comes back first, the
    same episode as run alone."""
    cfgs = [
        EpisodeConfig(world="tally", agents=3, world_seed=seed, time_limit=limit)
        for seed, limit in ((0, 120.0), (1, 15.0), (2, 60.0))
    ]
    together = run_episodes(cfgs, RandomPolicy(), concurrency=3)
    assert together[0].duration > max(ep.duration for ep in together[1:])
    assert [ep.config.world_seed for ep in together] == [0, 1, 2]
    for cfg, ep in zip(cfgs, together, strict=True):
        assert encode_episode(ep) == encode_episode(run_episode(cfg, RandomPolicy()))


@pytest.mark.timeout(60)
def test_an_episode_ending_in_the_instant_after_a_stop_is_not_emitted() -> None:
    """As above, but the time limit (5.6 s) comes before the chime: the instant applied after
    the stop ends the episode. It was cut short by the stop, so it is nobody's: ``retire``
    meets the cancellation before it records or emits it."""
    script = lambda r: "wait 0" if r.agent == 0 else "look"  # noqa: E731
    cfg = EpisodeConfig(world=CHIMES, agents=2, time_limit=5.6, params={"times": [5.75, 30.0]})
    assert stopped_at_batch([cfg], StopsTheRun(ScriptedPolicy(script), 2))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shielded", [False, True])
def test_a_run_stopped_mid_instant_lets_the_held_actors_go(shielded: bool) -> None:
    """Agents 0 and 2 bump and agent 1 halts, all landing at one instant: agent 0 is resumed
    (held until the instant is whole) before agent 1's tool stops the run around the conductor
    and awaits. Agent 0's task is still blocked in trio, but its resumption is the engine's: it
    is delivered once (not also cancelled, then rescheduled again when the instant is
    released), also when the cancellation lands in the tool's await and leaves the instant
    half applied; agent 2, not yet resumed, is cancelled. The run stops, no error, no hang."""
    script = lambda r: ("bump", "halt", "bump")[r.agent] if r.turn == 0 else "wait 0"  # noqa: E731
    cfg = EpisodeConfig(world=HALTS, agents=3, time_limit=50, params={"shielded": shielded})
    conductor = Conductor(ScriptedPolicy(script))

    async def main() -> None:
        async with trio.open_nursery() as runner:  # halt cancels this nursery
            runner.start_soon(conductor.play, [cfg])

    trio.run(main)
    assert conductor.quiet.runnable == 0


@pytest.mark.heavy
def test_ctrl_c_at_any_line_of_the_engine_stops_the_run_with_keyboard_interrupt() -> None:
    """A real SIGINT at each of the ~870 lines of ``collective/`` that three episodes run (one
    with a CEO hiring and firing), one run per line, in a subprocess (``ctrl_c_everywhere.py``):
    every run stops with KeyboardInterrupt alone, none hangs, and nothing is left behind. Before
    the engine's tasks were KI-protected, Ctrl-C between ``_resume`` taking an actor off its
    park and ``_release`` rescheduling it hung trio forever (a training run in CI did), and one
    in ``Quiescence.wait`` raised TrioInternalError."""
    report = ctrl_c_everywhere("engine", "1", timeout=300)
    assert report.endswith(" failed\n") and int(report.split()[-5]) > 500, report


@given(configs)
def test_time_limit_is_a_hard_stop(cfg: EpisodeConfig) -> None:
    ep = run_episode(cfg, RandomPolicy())
    *body, end = ep.events
    assert isinstance(end, Ended)
    assert all(e.t < cfg.time_limit for e in body), "something was committed at or after T_max"
    if end.reason == "time_limit":
        assert ep.duration == end.t == cfg.time_limit
    assert end.score == ep.score
    assert all(t < cfg.time_limit for t, _ in ep.curve)


@given(configs)
def test_every_message_is_delivered_once_or_dropped(cfg: EpisodeConfig) -> None:
    ep = run_episode(cfg, RandomPolicy())
    sent = {e.msg for e in ep.events if isinstance(e, Sent)}
    outcomes: dict[int, list[str]] = {}
    for e in ep.events:
        if isinstance(e, Delivered):
            outcomes.setdefault(e.msg, []).append("delivered")
        elif isinstance(e, Dropped) and e.reason != "evicted":
            outcomes.setdefault(e.msg, []).append(e.reason)
    assert set(outcomes) == sent
    assert all(len(v) == 1 for v in outcomes.values()), "a message had two fates"
    s = ep.stats
    assert s.sent == len(sent) == s.delivered + s.dropped
    assert s.delivered == s.read + s.evicted + s.unread


def test_overflow_is_explicit_and_counted() -> None:
    # Agent 0 sends a message every ~1.5 s; agent 1 reads its mailbox only every ~10 s.
    def script(req: PolicyRequest) -> str:
        return f'msg 1 "n{req.turn}"' if req.agent == 0 else "add 1"

    for overflow in ("drop_newest", "drop_oldest"):
        ep = run(script, world="tally", agents=2, time_limit=60, mailbox=3, overflow=overflow)
        s = ep.stats
        reads = [e.read for e in ep.events if type(e).__name__ == "Asked" and e.read]
        assert reads and all(len(r) <= 3 for r in reads), "a mailbox held more than its capacity"
        drops = {e.reason for e in ep.events if isinstance(e, Dropped)}
        if overflow == "drop_newest":
            assert drops == {"mailbox_full"} and s.dropped > 0 and s.evicted == 0
            assert all(list(r) == sorted(r) for r in reads)
        else:
            assert drops == {"evicted"} and s.evicted > 0 and s.dropped == 0
        assert s.sent == s.delivered + s.dropped
        assert s.delivered == s.read + s.evicted + s.unread


def test_one_batch_of_everyone_thinking_at_once() -> None:
    policy = ScriptedPolicy(by_turn("add 1", "add 2"))
    conductor = Conductor(policy)
    cfgs = [EpisodeConfig(world="tally", agents=n, world_seed=i) for i, n in enumerate((5, 7, 9))]
    trio.run(lambda: conductor.play(cfgs, concurrency=3))
    assert policy.batches[0] == 5 + 7 + 9, "all agents of all episodes think at t=0"
    assert conductor.batch_stats.largest == 21


def test_hire_and_fire_stay_within_budget() -> None:
    def script(req: PolicyRequest) -> str:
        # Everyone keeps hiring; agent 0 also fires the agents it hired, oldest first.
        if req.agent == 0 and req.turn % 3 == 2:
            return f"fire {3 + (req.turn // 3) % 6}"
        return "hire worker"

    for budget in (1, 2, 4):
        ep = run(script, world="tally", agents=3, budget=budget, time_limit=120)
        alive = 0
        for e in ep.events:
            if isinstance(e, Hired):
                alive += 1
            elif type(e).__name__ == "Fired":
                alive -= 1
            assert 0 <= alive <= budget
        assert ep.stats.hires >= budget
        spawned = [e for e in ep.events if isinstance(e, Spawned) and e.by >= 0]
        assert len(spawned) == ep.stats.hires


def test_episode_ends_early_when_the_world_is_done() -> None:
    ep = run(lambda r: "add 3", world="tally", agents=3, time_limit=1000)
    assert ep.end == "done" and ep.score == 1.0 and ep.duration < 1000
    assert ep.curve[-1] == (ep.duration, 1.0)


def test_everyone_waiting_forever_ends_idle() -> None:
    ep = run(lambda r: "wait 0", world="tally", agents=4, time_limit=1000)
    assert ep.end == "idle" and ep.duration < 5


def test_a_message_wakes_a_waiting_agent() -> None:
    def script(req: PolicyRequest) -> str:
        if req.agent == 1:
            return "wait 0" if req.turn == 0 else "add 1"
        return 'msg 1 "go"' if req.turn == 2 else "mark red"

    ep = run(script, world="tally", agents=2, time_limit=60)
    wake = next(e for e in ep.events if isinstance(e, Woke))
    sent = next(e for e in ep.events if isinstance(e, Sent))
    assert wake.agent == 1 and wake.t == sent.t and "message from 0" in wake.reason
    turn = next(t for t in ep.turns if t.agent == 1 and t.turn == 1)
    assert "inbox: [0] go" in turn.prompt


def test_channel_posts_reach_subscribers_by_subscription() -> None:
    def script(req: PolicyRequest) -> str:
        return 'post all "hello"' if req.agent == 0 and req.turn == 0 else "add 1"

    ep = run(script, world="tally", agents=3, time_limit=30)
    later = [t for t in ep.turns if t.agent != 0 and t.turn == 1]
    assert later and all("#all: [0] hello" in t.prompt for t in later)
    mine = next(t for t in ep.turns if t.agent == 0 and t.turn == 1)
    assert "#all: [0]" not in mine.prompt  # no echo of one's own post


def test_archive_outlives_messages() -> None:
    def script(req: PolicyRequest) -> str:
        if req.agent == 0:
            return 'put "key for m3 is blue"' if req.turn == 0 else "wait 0"
        return "wait 5" if req.turn == 0 else 'search "blue key"'

    ep = run(script, world="tally", agents=2, time_limit=20)
    found = [e for e in ep.events if isinstance(e, Committed) and e.tool == "search"]
    assert found and "note 0 by 0: key for m3 is blue" in found[0].result


def test_a_refusal_is_an_error_result_and_a_raising_tool_is_a_world_error() -> None:
    ep = run(by_turn('refuse "no"', "step 2", "crash"), world=FRAGILE, agents=2, time_limit=50)
    results = [e for e in ep.events if isinstance(e, Committed)]
    refused = [e for e in results if e.tool == "refuse"]
    assert len(refused) == 2 and refused[0].result == "error: refused: no" and not refused[0].ok
    assert sum(e.tool == "step" and e.ok for e in results) == 2, "a refusal: the episode goes on"
    assert ep.stats.tool_errors == 2
    # Anything else a tool raises is a bug in the world: the episode stops there.
    assert ep.end == "world_error" and not any(e.tool == "crash" for e in results)
    assert "Fragile.crash (tool, agent 0) raised RuntimeError: the world has a bug" in (
        world_error(ep)
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("jump 3", "unknown tool 'jump'"),
        ("add 9", "add: amount must be in 1..3, got 9"),
        ("add x", "add: amount must be an integer"),
        ("add", "add takes 1 argument(s)"),
        ('msg 0 "unterminated', "a text argument is one double-quoted string"),
        ("", "empty action"),
    ],
)
def test_a_malformed_action_is_rejected_with_a_reason(text: str, error: str) -> None:
    ep = run(by_turn(text), world="tally", agents=1, time_limit=20)
    rejected = [e for e in ep.events if isinstance(e, Rejected)]
    assert len(rejected) == 1 and error in rejected[0].error
    turn = ep.turns[0]
    assert turn.kind == "invalid" and turn.result.startswith("error:")
    assert ep.turns[1].prompt.endswith(f"last: {turn.result}\n>")


def test_concurrent_episodes_do_not_affect_each_other() -> None:
    cfgs = [EpisodeConfig(world="tally", agents=n, world_seed=n, sample_seed=n) for n in (2, 5, 3)]
    alone = [encode_episode(run_episode(c, RandomPolicy())) for c in cfgs]
    conductor = Conductor(RandomPolicy(), program=default_program)
    together = trio.run(lambda: conductor.play(cfgs, concurrency=3))
    assert [encode_episode(e) for e in together] != [] and sorted(
        encode_episode(e) for e in together
    ) == sorted(alone)


def test_bad_config_values_are_named() -> None:
    with pytest.raises(ValueError, match="time_limit must be > 0"):
        EpisodeConfig(time_limit=0)
    with pytest.raises(ValueError, match="unknown world 'atlantis'"):
        run_episode(EpisodeConfig(world="atlantis"), RandomPolicy())
    with pytest.raises(ValueError, match="unknown organisation 'anarchy'"):
        run_episode(EpisodeConfig(org="anarchy"), RandomPolicy())
    with pytest.raises(
        ValueError, match=r"world 'tally' has no parameter 'colour'; it takes: target"
    ):
        run_episode(EpisodeConfig(params={"colour": 1}), RandomPolicy())


def test_every_turn_names_the_action_space_it_was_sampled_under() -> None:
    ep = run_episode(
        EpisodeConfig(world="tally", agents=4, budget=2, time_limit=200), RandomPolicy()
    )
    assert ep.spaces and ep.turns
    for t in ep.turns:
        space = ep.spaces[t.space]
        if t.kind and t.kind != "invalid":
            assert space.tool(t.tool) is not None
    hired = {t.space for t in ep.turns if t.agent >= 4}
    first = {t.space for t in ep.turns if t.agent < 4 and t.turn == 0}
    assert not hired or hired != first, "hiring widens the msg range: a new space"

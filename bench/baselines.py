"""The bench scenario stepped two other ways: a round-based asyncio loop, and SimPy.

Both run the same world logic as the engine does in ``bench/engine.py``: the same ``Crowd``
world object and its tools (durations included), the same action space and parser, the city
organisation's primitives (direct message into a bounded mailbox that drops the newest on
overflow, archive put and search with the engine's own ``Archive``, wait with or without a
timeout, woken by a message), the same prompts, seeds, policy code per request and latency
model, and a ``Turn`` record per turn as the learner needs. What differs is only how time moves
and who runs when:

* ``run_rounds``: the way the best-known large LLM-agent simulators step their agents. Each
  round is ``dt`` simulated seconds; every round, ``await asyncio.gather(*(agent.step() for
  agent in agents))``, every agent, busy or not; an agent that is due calls the policy for itself
  (``await policy.generate([request])``) and its action lands at once; the policy's latency and
  the action's duration keep it busy for the rounds they span.
* ``run_simpy``: one SimPy process per agent, with ``env.timeout`` for the policy latency and
  for every tool's duration, and an event a message triggers for ``wait``.

Each keeps a log of its effects, one tuple each, so two runs can be compared by a digest. Both
are deliberately lean (no per-event records beyond that); the engine logs more.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import msgspec
import simpy

from bench.city import SparsePolicy
from collective import (
    Action,
    ActionError,
    ActionSpace,
    Cast,
    EpisodeConfig,
    ToolError,
    Turn,
    World,
    parse_action,
)
from collective.base.seeding import derive, derive_more
from collective.engine.comms import Archive
from policy.base import PolicyRequest, PolicyResponse


class Resident:
    """One agent's state, for either baseline."""

    __slots__ = (
        "acts",
        "busy_until",
        "deadline",
        "id",
        "inbox",
        "last",
        "seed_root",
        "turn",
        "waiting",
        "wake",
    )

    def __init__(self, agent_id: int, seed_root: int) -> None:
        self.id = agent_id
        self.seed_root = seed_root  # derive(sample_seed, id), folded as the engine's Actor does
        self.turn = 0
        self.acts = 0
        self.inbox: deque[tuple[int, str]] = deque()
        self.last = "you have just started"
        self.busy_until = 0.0  # rounds: when it may act again
        self.waiting = False
        self.deadline = -1.0  # rounds: when a wait times out (-1: never)
        self.wake: Any = None  # SimPy: the event a message triggers


class Town:
    """The shared state and the world logic both baselines step: one world, the primitives."""

    def __init__(self, cfg: EpisodeConfig, policy: SparsePolicy) -> None:
        if cfg.org != "city":
            raise ValueError(f"the baselines run the city organisation, not {cfg.org!r}")
        # The engine's own cast, so the world and action space are exactly the engine's.
        cast = Cast(cfg)
        self.cfg = cfg
        self.world: World = cast.worlds[0]
        self.space: ActionSpace = cast.space_for("worker", 0)
        self.policy = policy
        # Seeds folded as the engine folds them (``Actor.seed_root``): the same numbers as
        # derive(sample_seed, id, turn), one fold a turn rather than three.
        root = derive(cfg.sample_seed)
        self.residents = [Resident(i, derive_more(root, i)) for i in range(cfg.agents)]
        self.archive = Archive(cfg.archive_size)
        self.next_msg = 0
        self.log: list[tuple[Any, ...]] = []
        self.turns: list[Turn] = []
        self.tool_calls = 0
        self.delivered = 0
        self.dropped = 0
        self.policy_calls = 0
        # Turns whose answer landed before the time limit: what the engine counts as its turns
        # (``Stats.turns``). ``turns`` also holds the answers still in flight at the end.
        self.landed = 0

    # -- a turn: prompt, request, answer --------------------------------------------------------

    def request(self, r: Resident, now: float) -> PolicyRequest:
        """The engine's prompt (observation, inbox, last result) and request, for ``r``."""
        lines = [self.world.observe(r.id)]
        if r.inbox:
            lines.append("inbox: " + " | ".join(f"[{s}] {text}" for s, text in r.inbox))
            r.inbox.clear()
        lines.append(f"last: {r.last}")
        cfg = self.cfg
        req = PolicyRequest(
            agent=r.id,
            turn=r.turn,
            prompt="\n".join(lines) + "\n>",
            space=self.space,
            seed=derive_more(r.seed_root, r.turn),
            max_tokens=cfg.max_output_tokens,
            temperature=cfg.temperature,
            asked=now,
        )
        r.turn += 1
        return req

    def answered(self, r: Resident, req: PolicyRequest, resp: PolicyResponse, at: float) -> float:
        """Record the turn; return the simulated latency of the call."""
        self.turns.append(
            Turn(
                agent=r.id,
                turn=req.turn,
                role="worker",
                policy="trained",
                asked=req.asked,
                answered=at,
                prompt=req.prompt,
                text=resp.text,
                token_ids=resp.token_ids,
                logprobs=resp.logprobs,
                prompt_tokens=resp.prompt_tokens,
                version=resp.version,
            )
        )
        return self.cfg.latency.seconds(resp.prompt_tokens, len(resp.token_ids))

    def parse(self, r: Resident, text: str, now: float) -> Action | None:
        r.acts += 1
        try:
            return parse_action(text, self.space)
        except ActionError as e:
            r.last = f"error: {e}"
            self.log.append((now, r.id, "reject"))
            return None

    def duration(self, r: Resident, action: Action) -> float:
        if action.kind == "world":
            return self.world.tool_duration(action.tool, r.id, action.args)
        return self.cfg.comm_duration

    # -- effects ---------------------------------------------------------------------------------

    def apply(
        self, r: Resident, action: Action, now: float, wake: Callable[[Resident], None]
    ) -> str:
        """Land an action's effect; ``wake`` is how this baseline wakes a waiting recipient."""
        tool, args = action.tool, action.args
        self.log.append((now, r.id, tool))
        if action.kind == "world":
            self.tool_calls += 1
            try:
                return str(self.world.call_tool(tool, r.id, args))
            except ToolError as e:
                return f"error: {e}"
        if tool == "msg":
            to, text = int(args[0]), str(args[1])
            self.next_msg += 1
            other = self.residents[to] if 0 <= to < len(self.residents) else None
            if other is None or len(other.inbox) >= self.cfg.mailbox:
                self.dropped += 1
                return f"message to {to} dropped"
            other.inbox.append((r.id, text))
            self.delivered += 1
            if other.waiting:
                wake(other)
            return f"delivered to {to}"
        if tool == "put":
            return f"saved as note {self.archive.put(r.id, str(args[0]))}"
        if tool == "search":
            hits = self.archive.search(str(args[0]))
            if not hits:
                return "no notes match"
            return " | ".join(f"note {nid} by {a}: {text}" for nid, a, text in hits)
        raise AssertionError(f"the city organisation has no primitive {tool!r}")

    def digest(self) -> str:
        return hashlib.blake2b(msgspec.msgpack.encode(self.log), digest_size=16).hexdigest()


# -- (a) rounds: asyncio.gather over every agent, every round ---------------------------------


async def _step(town: Town, r: Resident, now: float) -> None:
    """One agent's share of a round: nothing unless it is due. As in such loops, the effect of
    an action lands as soon as the policy has answered; the action's duration (and the policy's
    latency) then keep the agent busy for the rounds they span."""
    if r.waiting:
        if r.inbox:
            r.last = "woke: message"
        elif 0 <= r.deadline <= now:
            r.last = "woke: timeout"
        else:
            return
        r.waiting = False
        town.log.append((now, r.id, "wake"))
    elif now < r.busy_until:
        return
    req = town.request(r, now)
    town.policy_calls += 1
    resp = (await town.policy.generate([req]))[0]  # one call per agent, as such loops do
    latency = town.answered(r, req, resp, now)
    town.landed += 1  # (in rounds an answer lands at once)
    action = town.parse(r, resp.text, now)
    if action is None:
        r.busy_until = now + latency
    elif action.tool == "wait":
        seconds = int(action.args[0])
        r.waiting = True
        r.deadline = now + latency + seconds if seconds else -1.0
    else:
        r.last = town.apply(r, action, now, no_wake)
        r.busy_until = now + latency + town.duration(r, action)


def no_wake(r: Resident) -> None:
    """The wake-up call where none is needed: rounds (a waiting agent looks at its inbox every
    round) and ``bench.engine.play_work`` (nobody in it waits)."""


async def _rounds(town: Town, dt: float, tick: Callable[[float], None] | None) -> None:
    now = 0.0
    while now < town.cfg.time_limit:
        await asyncio.gather(*(_step(town, r, now) for r in town.residents))
        now += dt
        if tick is not None:
            tick(now)


def run_rounds(
    cfg: EpisodeConfig,
    policy: SparsePolicy,
    dt: float = 1.0,
    tick: Callable[[float], None] | None = None,
) -> Town:
    """Step the scenario in rounds of ``dt`` simulated seconds until the time limit."""
    town = Town(cfg, policy)
    asyncio.run(_rounds(town, dt, tick))
    return town


# -- (b) SimPy: a process per agent, timeouts for durations ---------------------------------


def _agent(env: simpy.Environment, town: Town, r: Resident) -> Generator[Any, Any, None]:
    while True:
        req = town.request(r, env.now)
        town.policy_calls += 1
        resp = town.policy.answer(req)  # SimPy processes are synchronous: one call each
        yield env.timeout(town.answered(r, req, resp, env.now))
        town.landed += 1
        action = town.parse(r, resp.text, env.now)
        if action is None:
            continue
        if action.tool == "wait":
            if r.inbox:
                r.last = "woke: message"
                continue
            seconds = int(action.args[0])
            r.waiting, r.wake = True, env.event()
            if seconds:
                yield r.wake | env.timeout(seconds)
            else:
                yield r.wake
            r.last = "woke: message" if r.wake.triggered else "woke: timeout"
            r.waiting, r.wake = False, None
            town.log.append((env.now, r.id, "wake"))
            continue
        yield env.timeout(town.duration(r, action))
        r.last = town.apply(r, action, env.now, _simpy_wake)


def _simpy_wake(r: Resident) -> None:
    if not r.wake.triggered:
        r.wake.succeed()


def run_simpy(
    cfg: EpisodeConfig, policy: SparsePolicy, tick: Callable[[float], None] | None = None
) -> Town:
    """Run the scenario as SimPy processes until the time limit."""
    town = Town(cfg, policy)
    env = simpy.Environment()
    for r in town.residents:
        env.process(_agent(env, town, r))
    if tick is None:
        env.run(until=cfg.time_limit)
    else:  # in slices, to report progress
        step = cfg.time_limit / 50
        while env.now < cfg.time_limit:
            env.run(until=min(cfg.time_limit, env.now + step))
            tick(env.now)
    return town

"""Per-agent credit by leave-one-out: what the episode would have scored without each agent.

The per-agent ablation needs each agent's own contribution. Splitting each rise of the score
among the agents whose world tools landed then credits only the hands that built, and nothing
to an agent who passed on the key that let them, or the CEO whose hire brought them in: an
ablation built to lose. A counterfactual credits every action through its consequences:

    credit(i) = score(episode) - score(episode with agent i idle)

The counterfactual re-runs the episode in the real engine with every other agent giving its
recorded answers (open loop: they say what they said, whether or not it still makes sense; an
answer past the end of the record is an empty, invalid action) and agent i answering ``wait``
whenever asked. Leaving out the CEO therefore leaves out its hires and all they did; leaving out
the holder of a key leaves its keys unshared. Credits do not sum to the score (work that needed
two agents is credited to both). A re-run costs an episode with a policy that never calls a
model; ``leave_one_out`` runs every counterfactual of a batch of episodes concurrently.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import trio

from collective.engine.conductor import Conductor
from collective.records import Episode, Spawned
from collective.replay.recorded import RecordedPolicy
from policy import tokenizer
from policy.base import PolicyRequest, PolicyResponse


class LeaveOut(RecordedPolicy):
    """The record's answers, except that ``agent`` waits as long as it may whenever asked."""

    def __init__(self, episode: Episode, agent: int) -> None:
        super().__init__(episode.turns)
        self.agent = agent
        self.name = f"recorded, agent {agent} idle"

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        others = [r for r in requests if r.agent != self.agent]
        answered = iter(await super().generate(others) if others else [])
        return [_idle(r) if r.agent == self.agent else next(answered) for r in requests]


def _idle(r: PolicyRequest) -> PolicyResponse:
    wait = r.space.tool("wait")
    # (no wait in this space: an empty answer, an invalid action, which changes nothing either)
    text = f"wait {wait.args[0].hi}" if wait is not None else ""
    ids = [*tokenizer.encode(text), tokenizer.EOS]
    return PolicyResponse(
        text=text,
        token_ids=ids,
        logprobs=[0.0] * len(ids),
        prompt_tokens=tokenizer.count(r.prompt),
        version=-1,
    )


def agents_of(episode: Episode) -> list[int]:
    """Every agent that took part (hired and fired ones included), in id order."""
    return sorted({e.agent for e in episode.events if isinstance(e, Spawned)})


async def leave_one_out_async(
    episodes: Sequence[Episode], *, concurrency: int = 16
) -> list[dict[int, float]]:
    """For each episode, ``{agent: score - score without that agent}``, for every agent."""
    jobs = [(k, a) for k, ep in enumerate(episodes) for a in agents_of(ep)]
    out: list[dict[int, float]] = [{} for _ in episodes]
    limit = trio.CapacityLimiter(concurrency)

    async def one(k: int, agent: int) -> None:
        ep = episodes[k]
        cfg = msgspec.structs.replace(ep.config, keep_prompts=False)
        policy = LeaveOut(ep, agent)
        async with limit:
            (cf,) = await Conductor({"trained": policy, "frozen": policy}).play([cfg])
        out[k][agent] = ep.score - cf.score

    async with trio.open_nursery() as nursery:
        for k, agent in jobs:
            nursery.start_soon(one, k, agent)
    return [dict(sorted(c.items())) for c in out]


def leave_one_out(episodes: Sequence[Episode], *, concurrency: int = 16) -> list[dict[int, float]]:
    """``leave_one_out_async`` from synchronous code (not from inside a trio run)."""
    return trio.run(lambda: leave_one_out_async(episodes, concurrency=concurrency))

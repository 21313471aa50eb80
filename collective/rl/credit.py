"""How a step's returns reach each trained turn: the ``Credit`` seam, one ``assign`` a kind of
``advantage`` (collective: the rollout's own; individual: leave-one-out per agent; turn: forks),
so the training loop calls one without asking which.

Per-agent credit by leave-one-out: what the episode would have scored without each agent.

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

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import msgspec
import numpy as np
import trio

from collective.base.seeding import derive
from collective.engine.conductor import Conductor
from collective.records import Episode, Spawned
from collective.replay.recorded import RecordedPolicy
from collective.rl.config import Individual, TrainConfig, Turn
from collective.rl.forks import group_turn_advantages, trained_turn
from policy import tokenizer
from policy.base import Policy, PolicyRequest, PolicyResponse


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


# == The credit seam: how a step's rollouts' returns reach each trained turn ======================


class Credited(NamedTuple):
    """A step's credit: for each group, each episode's trained turns' own advantages by turn
    index (a trained turn not in it keeps its rollout's group advantage, ``A_i``), and the
    rollouts played to find them (forks)."""

    turns: list[list[dict[int, float]]]
    rollouts: int = 0


class Credit(Protocol):
    """How a step's groups are credited: one ``assign`` a kind of ``advantage``
    (``credit_for`` picks it from the config's union). It runs off the event loop (a thread):
    it may run episodes in a trio run of its own."""

    def assign(self, step: int, groups: list[list[Episode]]) -> Credited: ...


class RolloutCredit:
    """``advantage = "collective"``: every trained turn keeps its rollout's advantage."""

    def assign(self, step: int, groups: list[list[Episode]]) -> Credited:
        return Credited([[{} for _ in g] for g in groups])


class AgentCredit:
    """``advantage = "individual"``: each agent's turns get its leave-one-out credit, less the
    group's mean (``individual_advantages``)."""

    def assign(self, step: int, groups: list[list[Episode]]) -> Credited:
        out = []
        for episodes, credits in zip(groups, group_credits(groups), strict=True):
            per_agent = individual_advantages(episodes, credits)
            out.append(
                [
                    {j: per_agent[i][t.agent] for j, t in enumerate(ep.turns) if trained_turn(t)}
                    for i, ep in enumerate(episodes)
                ]
            )
        return Credited(out)


class ForkCredit:
    """``advantage = "turn"``: every episode's forked turns' advantages
    (``collective.rl.forks``). ``policy_of(step, episode)`` is the policy of the version that
    played the episode, so a fork re-samples the turn from the distribution it was drawn from;
    the forks' seeds are derived from the run's seed and the step, so a resumed or repeated run
    forks alike."""

    def __init__(self, turn: Turn, seed: int, policy_of: Callable[[int, Episode], Policy]) -> None:
        self.turn, self.seed, self.policy_of = turn, seed, policy_of

    def assign(self, step: int, groups: list[list[Episode]]) -> Credited:
        credit, rollouts = group_turn_advantages(
            groups,
            lambda ep: self.policy_of(step, ep),
            turns=self.turn.turns,
            samples=self.turn.samples,
            horizon=self.turn.horizon,
            seed=derive(self.seed, step),
        )
        return Credited(credit, rollouts)


def credit_for(
    cfg: TrainConfig, policy_of: Callable[[int, Episode], Policy] | None = None
) -> Credit:
    """The credit the config's ``advantage`` names; ``policy_of`` (the playing version's policy
    of an episode) is what forks need."""
    adv = cfg.advantage
    if isinstance(adv, Turn):
        if policy_of is None:
            raise ValueError(
                "advantage = 'turn' forks each episode with the weights of the version that "
                "played it: credit_for needs policy_of"
            )
        return ForkCredit(adv, cfg.seed, policy_of)
    return AgentCredit() if isinstance(adv, Individual) else RolloutCredit()


def individual_advantages(
    episodes: list[Episode], credits: list[dict[int, float]]
) -> list[dict[int, float]]:
    """The per-agent advantage of a group: each agent's leave-one-out credit minus the mean
    credit of every agent that took part in the group's episodes (hired and fired ones
    included, one term per agent per episode), so that, like the collective advantage, it
    sums to zero over the group's agents: a group where every agent mattered alike teaches
    nothing, and no agent's turns are pushed up merely because credits are positive."""
    everyone = [
        (i, ev.agent) for i, e in enumerate(episodes) for ev in e.events if isinstance(ev, Spawned)
    ]
    base = float(np.mean([credits[i].get(a, 0.0) for i, a in everyone])) if everyone else 0.0
    out: list[dict[int, float]] = [{} for _ in episodes]
    for i, a in everyone:
        out[i][a] = credits[i].get(a, 0.0) - base
    return out


def group_credits(groups: list[list[Episode]]) -> list[list[dict[int, float]]]:
    """Every agent's leave-one-out credit, group by group; all the counterfactual re-runs of the
    step at once (in its own trio run: call it from a thread)."""
    flat = leave_one_out([e for g in groups for e in g])
    out, i = [], 0
    for g in groups:
        out.append(flat[i : i + len(g)])
        i += len(g)
    return out

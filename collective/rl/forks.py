"""Per-turn credit from forks (``advantage = "turn"``): a Monte Carlo value for sampled turns.

The flat collective advantage gives every token of every agent the same credit, so in a long
episode of many agents most of it lands on turns that had nothing to do with the outcome. This
project's episodes are deterministic and forkable at any instant, so a turn's own effect can be
measured: fork the episode at the instant the turn was asked (:func:`collective.replay.fork`:
exact up to there, then live), ``K`` times with other sampling seeds and the policy that played
it, so the turn is answered anew and everything after plays on. The forks' mean return
estimates the value of the state the turn was asked in; the episode's own return is one sample
of the value of the answer it got. The turn's advantage is their difference, what the answer did
beyond what the policy does from there on average (VinePPO's estimate, here for one agent's turn
among many). Turns not sampled keep the group's flat advantage.

The return is the anytime score ``fork_horizon`` seconds after the fork (0: at the end), for the
episode and its forks alike, so a turn is credited with what followed it within that window;
a fork still plays to the episode's end (its cost is not capped by the horizon). The latency
penalty is not applied to a turn's credit (it is a property of the whole episode).

Cost: ``fork_turns x fork_samples`` extra episodes per rollout, each replaying its prefix
without model calls and sampling from the fork on; ``StepMetrics.fork_rollouts`` counts them, to
be set against the step's own rollouts when credit schemes are compared at equal compute.
"""

from __future__ import annotations

from collections.abc import Callable

from collective.base.seeding import Stream, derive
from collective.records import Episode, Turn
from collective.records.signs import score_at
from collective.replay import fork
from policy.base import Policy

#: Salt for the streams that choose turns and fork seeds, apart from every other stream.
_FORK_SALT = 0x666F726B


#: The most forks a rollout may cost (``fork_turns x fork_samples``): each fork is an episode
#: played from the forked turn on, so past this a step's credit costs a thousand times its own
#: rollouts, a budget no run of this engine meets (VinePPO's own estimates use about 9 a turn).
MAX_FORKS_PER_ROLLOUT = 1_000


def fork_budget(turns: int, samples: int, rollouts_per_step: int, steps: int) -> str:
    """Why ``advantage = "turn"`` with these sizes cannot be run ("" if it can), with the
    figure it would take: the forks a rollout costs, a step's and the run's, as totals."""
    per_rollout = turns * samples
    if per_rollout <= MAX_FORKS_PER_ROLLOUT:
        return ""
    return (
        f"fork_turns x fork_samples = {turns:,} x {samples:,} = {per_rollout:,} forks a rollout "
        f"({per_rollout * rollouts_per_step:,} fork episodes a step, "
        f"{per_rollout * rollouts_per_step * steps:,} over the run's {steps:,} steps); at most "
        f"{MAX_FORKS_PER_ROLLOUT:,} forks a rollout"
    )


def trained_turn(turn: Turn) -> bool:
    """Whether the learner trains on ``turn``: the trained policy answered it with tokens (the
    orchestrator's frozen sub-agents' turns, and turns answered without a model, are not)."""
    return turn.policy == "trained" and bool(turn.token_ids)


def sample_turns(ep: Episode, k: int, seed: int) -> list[int]:
    """Up to ``k`` indices of ``ep.turns`` to fork at, drawn without replacement by a seeded
    stream among the trained policy's answered turns (those with tokens), in turn order."""
    able = [i for i, t in enumerate(ep.turns) if trained_turn(t)]
    stream = Stream(derive(_FORK_SALT, seed))
    chosen: list[int] = []
    while able and len(chosen) < k:
        chosen.append(able.pop(stream.below(len(able))))
    return sorted(chosen)


def turn_advantages(
    ep: Episode, policy: Policy, turns: list[int], samples: int, horizon: float, seed: int
) -> tuple[dict[int, float], int]:
    """``{turn index: advantage}`` for ``turns`` of ``ep``, and the forks it ran. Each fork
    re-samples from the instant the turn was asked, with ``policy`` and its own sampling seed."""
    out: dict[int, float] = {}
    runs = 0
    for i in turns:
        asked = ep.turns[i].asked
        at = ep.config.time_limit if horizon <= 0 else min(asked + horizon, ep.config.time_limit)
        values = []
        for k in range(samples):
            forked = fork(ep, asked, policy, sample_seed=derive(_FORK_SALT, seed, i, k))
            values.append(score_at(forked, at))
            runs += 1
        out[i] = score_at(ep, at) - sum(values) / len(values)
    return out, runs


def group_turn_advantages(
    groups: list[list[Episode]],
    policy_of: Callable[[Episode], Policy],
    *,
    turns: int,
    samples: int,
    horizon: float,
    seed: int,
) -> tuple[list[list[dict[int, float]]], int]:
    """Every episode's per-turn advantages (:func:`turn_advantages`, ``turns`` sampled turns
    each), group by group, and the number of fork rollouts run. ``policy_of`` gives the policy
    that played an episode (the same weights and version). Synchronous: each fork is its own trio
    run, so call it from a thread, as the leave-one-out credit is."""
    out: list[list[dict[int, float]]] = []
    runs = 0
    for g, episodes in enumerate(groups):
        row: list[dict[int, float]] = []
        for m, ep in enumerate(episodes):
            s = derive(seed, g, m)
            chosen = sample_turns(ep, turns, s)
            if not chosen:  # (no answered turn: nothing to fork, no policy to build)
                row.append({})
                continue
            adv, n = turn_advantages(ep, policy_of(ep), chosen, samples, horizon, s)
            row.append(adv)
            runs += n
        out.append(row)
    return out, runs

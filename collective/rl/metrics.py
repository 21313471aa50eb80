"""What a training step's groups say, as ``metrics.jsonl`` writes it (``StepMetrics``).

The learner never reads these: ``train.step_samples`` hands a step's returns, staleness and
staleness weights here, and the figures go to the run directory beside the step. Useful work is
reported relative to the step's own average rollout (every team size alike), as the reference
work measures it; with a mix of worlds every figure is also given per world, with its
normalised score against the world's baselines (``collective/rl/baselines.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from collective.records import Episode
from collective.records.signs import Signs, signs
from collective.rl.baselines import Baselines
from collective.rl.config import TrainConfig
from collective.rl.rollouts import team_size
from collective.rl.rundir import TEAM_BUCKETS, bucket


def metrics_of(
    cfg: TrainConfig,
    ids: Sequence[int],
    groups: list[list[Episode]],
    returns: list[np.ndarray],
    staleness: list[int],
    weights: list[float | None],
    worlds: list[str],
    baselines: Baselines | None,
) -> dict[str, Any]:
    """A step's metrics: over all its groups, and with a mix of worlds (``[mix]``) per world
    under ``worlds`` with the normalised score and gain over them. ``returns`` and ``worlds``
    (each group's world label) are every group's; ``staleness`` and ``weights`` (the staleness
    rule's, None for an episode dropped) every episode's, in group and member order; ``ids``
    every group's index."""
    everything = range(len(groups))
    each = [signs(e) for episodes in groups for e in episodes]  # (read once, for every table)
    of = partial(step_metrics, cfg, ids, groups, returns, staleness, weights, each)
    metrics = of(everything)
    if cfg.mix is None:
        return metrics
    per_world = {
        w.label: of([g for g in everything if worlds[g] == w.label])
        for w in cfg.worlds
        if w.label in worlds
    }
    if baselines is not None:
        for label, m in per_world.items():
            m.update(baselines.normalised(label, m["score_mean"]))
        metrics.update(
            {
                key: float(np.mean([m[key] for m in per_world.values()]))
                for key in ("normalised_score", "normalised_gain")
            }
        )
    metrics["worlds"] = per_world
    return metrics


def step_metrics(
    cfg: TrainConfig,
    ids: Sequence[int],
    groups: list[list[Episode]],
    returns: list[np.ndarray],
    staleness: list[int],
    weights: list[float | None],
    each: list[Signs],
    which: Sequence[int],
) -> dict[str, Any]:
    """The metrics of a step's groups ``which`` (all of them, or one world's): ``returns`` are
    every group's, ``staleness``, ``weights`` and ``each`` (its signs) every episode's, in group
    and member order; ``ids`` every group's index."""
    G = cfg.group_size
    flat = [groups[g][i] for g in which for i in range(len(groups[g]))]
    returns_all = np.concatenate([returns[g] for g in which])
    stale = [staleness[g * G + i] for g in which for i in range(len(groups[g]))]
    weight = [weights[g * G + i] for g in which for i in range(len(groups[g]))]
    by_bucket: dict[str, list[float]] = {}
    teams: dict[str, list[Signs]] = {}
    for g in which:
        team = bucket(team_size(cfg, ids[g]))
        by_bucket.setdefault(team, []).extend(e.stats.world_tokens for e in groups[g])
        teams.setdefault(team, []).extend(each[g * G + i] for i in range(len(groups[g])))
    useful = [e.stats.world_tokens for e in flat]
    useful_average = float(np.mean(useful))
    hours = sum(e.duration for e in flat) / 3600
    return {
        "time_limit": flat[0].config.time_limit,
        "episodes": len(flat),
        "return_mean": float(np.mean(returns_all)),
        "return_min": float(np.min(returns_all)),
        "return_max": float(np.max(returns_all)),
        "score_mean": float(np.mean([e.score for e in flat])),
        "duration_mean": float(np.mean([e.duration for e in flat])),
        "output_tokens": int(sum(e.stats.output_tokens for e in flat)),
        "useful_tokens_mean": float(np.mean(useful)),
        "useful_average": useful_average,
        "useful_rel": {
            b: float(np.mean(v)) / useful_average if useful_average else 0.0
            for b, v in sorted(by_bucket.items(), key=lambda kv: TEAM_BUCKETS.index(kv[0]))
        },
        "comm_tokens_per_hour": sum(e.stats.comm_tokens for e in flat) / hours if hours else 0.0,
        **sign_metrics(teams),
        "staleness_mean": float(np.mean(stale)),
        "staleness_max": int(max(stale)),
        "dropped_stale": weight.count(None),
        "downweighted": sum(1 for w in weight if w is not None and w < 1.0),
    }


def sign_metrics(teams: dict[str, list[Signs]]) -> dict[str, Any]:
    """The signs of life of a step (StepMetrics' landed_* and talk_*) from its episodes' signs by
    team-size bucket: each bucket's mean per rollout over the step's average rollout (every
    bucket's episodes alike, as the reference work measures it), per agent, and communication
    per agent-second (tokens over the agents' summed seconds alive)."""
    order = sorted(teams, key=TEAM_BUCKETS.index)
    every = [x for b in order for x in teams[b]]
    landed = float(np.mean([x.landed_tokens for x in every]))
    talk = float(np.mean([x.talk_tokens for x in every]))
    begun = sum(x.landed_tokens + x.refused_tokens for x in every)

    def per_second(xs: list[Signs]) -> float:
        seconds = sum(x.agent_seconds for x in xs)
        return sum(x.talk_tokens for x in xs) / seconds if seconds > 0 else 0.0

    def rel(b: str, field: str, average: float) -> float:
        return float(np.mean([getattr(x, field) for x in teams[b]])) / average if average else 0.0

    return {
        "landed_tokens_mean": landed,
        "landed_units_mean": float(np.mean([x.landed_units for x in every])),
        "refused_share": sum(x.refused_tokens for x in every) / begun if begun else 0.0,
        "landed_rel": {b: rel(b, "landed_tokens", landed) for b in order},
        "landed_per_agent": {
            b: float(np.mean([x.landed_per_agent for x in teams[b]])) for b in order
        },
        "talk_tokens_mean": talk,
        "talk_per_agent_second": per_second(every),
        "talk_rel": {b: rel(b, "talk_tokens", talk) for b in order},
        "talk_per_agent_second_by_team": {b: per_second(teams[b]) for b in order},
    }

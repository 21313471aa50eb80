"""Each world's baselines in a mix, and the normalised score they give a step.

Worlds score on their own scales (a tally's 0..1 is not a workshop's), so a run over a mix of
worlds (``[[worlds]]``) cannot read progress off one mean return. Before its first step such a
run plays ``mix.baseline_episodes`` held-out episodes a world with the random policy and with the
untrained weights (the run's version 0), through the same protocol as training; each step then
reports, per world and averaged over the worlds it drew,

- ``normalised_score`` = (score - random) / scale: how far above chance, and
- ``normalised_gain`` = (score - untrained) / scale: how far training has moved it,

``scale`` the spread (standard deviation) of that world's baseline scores, random and untrained
together (1 where they are all equal), the "normalised performance across environments" of the
recipe this project implements. A z-score by the baselines' spread is used rather than the
fraction of the way from random to untrained, because an untrained tiny policy scores about what
random does, so that fraction divides by about zero.

The baselines are a function of the config (their seeds derive from the run's seed, held out
of training's), written to ``RUN/baselines.json`` and read back on resume.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from collective.base.outputs import write_file
from collective.base.seeding import derive
from collective.engine.conductor import run_episodes
from collective.engine.limits import EPISODE_AGENT_BYTES, check_fits, human
from collective.records import EpisodeConfig
from collective.rl.config import Mix, TrainConfig, mix, time_limit_at
from collective.rl.rollouts import episode_config
from collective.rl.rundir import read_run_file
from policy.uniform import RandomPolicy

__all__ = ["Baselines", "baseline_configs", "measure_baselines"]

#: The stream tag of the baselines' seeds (training's are derive(seed, group[, member])).
BASELINE_SEEDS = 0x6261736531


class WorldBaseline(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    random: list[float]  # the scores of the random policy's episodes
    untrained: list[float]  # those of the untrained weights', on the same instances

    @property
    def scale(self) -> float:
        spread = float(np.std(self.random + self.untrained))
        return spread if spread > 0 else 1.0


class Baselines(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every world's baseline scores, by the world's label."""

    worlds: dict[str, WorldBaseline]

    def normalised(self, label: str, score: float) -> dict[str, float]:
        """A step's score on world ``label`` against its baselines (the module docstring)."""
        b = self.worlds[label]
        random, untrained = float(np.mean(b.random)), float(np.mean(b.untrained))
        return {
            "random_score": random,
            "untrained_score": untrained,
            "normalised_score": (score - random) / b.scale,
            "normalised_gain": (score - untrained) / b.scale,
        }

    def save(self, run: Path) -> None:
        write_file(run / "baselines.json", msgspec.json.encode(self) + b"\n", "baselines")

    @classmethod
    def load(cls, run: Path) -> Baselines | None:
        path = run / "baselines.json"
        data = read_run_file(path)  # (a FIFO there is refused, never waited on)
        if data is None:
            return None
        try:
            return msgspec.json.decode(data, type=cls)
        except msgspec.DecodeError as e:
            raise ValueError(
                f"{path}: not a baselines record ({e}); delete it to measure again"
            ) from None


def baseline_configs(cfg: TrainConfig) -> dict[str, list[EpisodeConfig]]:
    """Each world's baseline episodes: ``mix.baseline_episodes`` instances, its team sizes
    cycled, at its step-0 time limit, seeded apart from every training group."""
    out: dict[str, list[EpisodeConfig]] = {}
    episodes = (cfg.mix or Mix()).baseline_episodes
    for w_index, w in enumerate(mix(cfg)):
        out[w.label] = [
            episode_config(
                cfg,
                w,
                w.team_sizes[k % len(w.team_sizes)],
                world_seed=derive(cfg.seed, BASELINE_SEEDS, w_index, k) >> 33,
                sample_seed=derive(cfg.seed, BASELINE_SEEDS, w_index, k, 1) >> 1,
                time_limit=time_limit_at(cfg, 0, w),
                version=0,
            )
            for k in range(episodes)
        ]
    return out


def check_baselines(cfg: TrainConfig) -> None:
    """ValueError (one line) if the baseline episodes cannot be held: each policy's are kept
    whole until scored, ``mix.baseline_episodes`` a world of the mix, at most its largest team
    each; checked as a total before any config is built."""
    teams = [max(w.team_sizes) for w in mix(cfg)]
    episodes = (cfg.mix or Mix()).baseline_episodes
    kept = episodes * sum(teams)  # agents in the kept episodes, at most
    check_fits(
        f"baselines: {episodes * len(teams):,} episodes kept ({episodes:,} a world)",
        {f"their agents at {human(EPISODE_AGENT_BYTES)} each": kept * EPISODE_AGENT_BYTES},
    )


def measure_baselines(cfg: TrainConfig, untrained: Any) -> Baselines:
    """Play every world's baseline episodes with the random policy and with ``untrained`` (a
    policy sampling the run's version-0 weights)."""
    check_baselines(cfg)
    configs = baseline_configs(cfg)
    flat = [c for cs in configs.values() for c in cs]
    scores = {}
    for name, policy in (("random", RandomPolicy()), ("untrained", untrained)):
        episodes = run_episodes(flat, policy, concurrency=min(cfg.concurrency, len(flat)))
        scores[name] = [e.score for e in episodes]
    out, i = {}, 0
    for label, cs in configs.items():
        part = slice(i, i + len(cs))
        out[label] = WorldBaseline(
            random=scores["random"][part], untrained=scores["untrained"][part]
        )
        i += len(cs)
    for label, b in out.items():
        if not all(math.isfinite(x) for x in b.random + b.untrained):
            raise ValueError(f"world {label!r}: a baseline episode scored {b} (not finite)")
    return Baselines(worlds=out)

"""A training run small enough for a test (a few seconds a step on the tally world), as a
``TrainConfig`` and as a config file, and what a rerun of it must match."""

from __future__ import annotations

from pathlib import Path

import msgspec

from collective.rl.config import TrainConfig, WorldEntry, read_config
from collective.rl.rundir import StepMetrics, read_metrics
from policy.tiny import TinyConfig

SMALL_TRAIN = dict(
    world="tally",
    params={"target": 12},
    team_sizes=(1, 3),
    groups_per_step=2,
    group_size=3,
    time_limit_start=60.0,
    time_limit_end=60.0,
    concurrency=6,
    max_output_tokens=12,
    plots=False,
    model=TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, context=96),
)

# The same run as a config file, for the command line.
SMALL_TOML = """
world = "tally"
params = {target = 12}
team_sizes = [1, 3]
steps = 2
groups_per_step = 2
group_size = 3
time_limit_start = 60.0
time_limit_end = 60.0
concurrency = 6
max_output_tokens = 12
plots = false

[model]
d_model = 32
n_layers = 1
n_heads = 2
d_ff = 64
context = 96
"""


def small_train(**over: object) -> TrainConfig:
    """``SMALL_TRAIN`` with ``over`` set."""
    return read_config({**SMALL_TRAIN, **over})


def comparable_metrics(run: Path) -> list[dict]:
    """A run's metrics.jsonl without the wall-clock fields: what a rerun must match exactly."""
    return [
        {k: v for k, v in msgspec.to_builtins(m).items() if k not in StepMetrics.WALL_CLOCK}
        for m in read_metrics(run)
    ]


def small_mix(**over: object) -> TrainConfig:
    """Two built-in worlds on their own time scales, small enough for a test."""
    base: dict[str, object] = dict(
        worlds=(
            WorldEntry(
                world="tally",
                params={"target": 12},
                team_sizes=(1, 3),
                time_limit_start=60.0,
                time_limit_end=60.0,
            ),
            WorldEntry(
                world="workshop",
                team_sizes=(2,),
                weight=2.0,
                time_limit_start=90.0,
                time_limit_end=90.0,
            ),
        ),
        steps=2,
        groups_per_step=4,
        group_size=2,
        concurrency=8,
        max_output_tokens=12,
        baseline_episodes=2,
        plots=False,
        model=SMALL_TRAIN["model"],
    )
    return read_config({**base, **over})

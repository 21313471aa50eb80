"""The signs-of-life study's setting: the world, the latency, the model and the evaluation
limit that both the study (:mod:`experiments.signs_of_life`) and its starting prior
(:mod:`experiments.prior`) play, in one place so neither imports the other's module."""

from __future__ import annotations

from policy.tiny import TinyConfig
from worlds.workshop import FINDINGS

EVAL_T = 180.0  # the main run's last time limit: every policy is evaluated at it
WORLD = dict(FINDINGS)  # worlds/workshop.py: each finding learnable, none forced (its tables)
LATENCY = "tiny-paced"  # 50 ms an output token: tokens cost time, so a token budget binds
# A context of 256 bytes holds the inbox in every prompt measured (128: about one in twenty;
# the workshop docstring's table). Recorded in every checkpoint: older ones load with 128.
MODEL = TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, context=256)

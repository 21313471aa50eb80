"""Moved to ``collective.latency`` (the latency model is the engine's: it says when an answer
lands in simulated time). This name stays only until ``collective/rollouts.py``,
``bench/cluster.py`` and ``bench/signs_of_life.py``, edited on other branches now, import it
from there; then delete it."""

from collective.latency import DEFAULT_PRESET, PRESETS, LatencyModel, latency_preset

__all__ = ["DEFAULT_PRESET", "PRESETS", "LatencyModel", "latency_preset"]

"""Moved to ``collective.latency`` (the latency model is the engine's: it says when an answer
lands in simulated time). This name stays only until ``bench/signs_of_life.py``
(edited on another branch now) imports it
from there; then delete it."""

from collective.latency import DEFAULT_PRESET, PRESETS, LatencyModel, latency_preset

__all__ = ["DEFAULT_PRESET", "PRESETS", "LatencyModel", "latency_preset"]

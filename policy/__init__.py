"""Policies: the request/response types, the backends, the latency model."""

from policy.base import Policy, PolicyError, PolicyRequest, PolicyResponse
from policy.latency import PRESETS, LatencyModel, latency_preset

__all__ = [
    "PRESETS",
    "LatencyModel",
    "Policy",
    "PolicyError",
    "PolicyRequest",
    "PolicyResponse",
    "latency_preset",
]

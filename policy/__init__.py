"""Policies: the request/response types and the backends. (The latency model, which says when
an answer lands in simulated time, is the engine's: ``collective.base.latency``.)"""

from policy.base import Policy, PolicyError, PolicyRequest, PolicyResponse

__all__ = ["Policy", "PolicyError", "PolicyRequest", "PolicyResponse"]

"""One episode on the real engine with a scripted policy: ``run`` and ``by_turn``."""

from __future__ import annotations

from collective import Episode, EpisodeConfig, run_episode
from policy.base import PolicyRequest
from policy.scripted import ScriptedPolicy


def run(script: object, **cfg: object) -> Episode:
    """Run one episode with a scripted policy (a function of the request) or a given policy.

    Scripts write whole actions, a file of the repo world (up to 4,000 characters, a token a
    byte) included, so answers may be that long unless a test sets ``max_output_tokens``: past
    it an answer is an invalid action."""
    cfg.setdefault("max_output_tokens", 4096)
    policy = ScriptedPolicy(script) if callable(script) else script  # type: ignore[arg-type]
    return run_episode(EpisodeConfig(**cfg), policy)  # type: ignore[arg-type]


def by_turn(*actions: str):
    """A script that plays ``actions`` in turn order for every agent, then waits forever."""

    def script(req: PolicyRequest) -> str:
        return actions[req.turn] if req.turn < len(actions) else "wait 0"

    return script

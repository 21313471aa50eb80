"""Policies by name, as the command line and configs give them.

``random``; ``tiny`` (fresh weights from the given seed) or ``tiny:PATH`` (a checkpoint);
``sglang:URL`` or ``sglang:launch:MODEL``.
"""

from __future__ import annotations

from policy.base import Policy


def make_policy(spec: str, *, seed: int = 0) -> Policy:
    name, _, arg = spec.partition(":")
    if name == "random" and not arg:
        from policy.uniform import RandomPolicy

        return RandomPolicy()
    if name == "tiny":
        from policy.tiny import TinyConfig, TinyModel, TinyPolicy

        if not arg:
            return TinyPolicy(
                TinyModel.fresh(TinyConfig(seed=seed)), name=f"tiny (fresh weights, seed {seed})"
            )
        return TinyPolicy(TinyModel.load(arg), name=f"tiny:{arg}")
    raise ValueError(f"unknown policy {spec!r}; policies are: random, tiny, tiny:PATH")

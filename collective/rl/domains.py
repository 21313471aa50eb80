"""What values each number of the train config may take: a domain per dotted path, checked
once, where the config is read (:mod:`collective.rl.config`'s structs call :func:`check` from
``__post_init__``), so a bad value is one line naming the field, before any work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec


class Domain(NamedTuple):
    """What values a config field may take: ``holds(value)``, and how an error says it."""

    holds: Callable[[Any], bool]
    says: str


def _at_least(n: int) -> Domain:
    # (the upper bound: config.toml is TOML, whose integers are 64-bit)
    return Domain(lambda x: n <= x < 2**63, f">= {n} (a 64-bit integer)")


FINITE_POSITIVE = Domain(lambda x: 0 < x < math.inf, "finite and > 0")  # (nan is neither)
FINITE_NON_NEGATIVE = Domain(lambda x: 0 <= x < math.inf, "finite and >= 0")


# The domain of every number in the tree, by its dotted path (Literal and bool fields have theirs
# in their type; STRINGS says what checks each string, and when).
DOMAINS: dict[str, Domain] = {
    "worlds.team_sizes": Domain(
        lambda t: bool(t) and min(t) >= 1 and max(t) < 2**63, ">= 1 (at least one size)"
    ),
    "worlds.weight": Domain(lambda x: 0 <= x < math.inf, "finite and >= 0"),
    "worlds.time_limit_start": FINITE_POSITIVE,
    "worlds.time_limit_end": FINITE_POSITIVE,
    "mix.baseline_episodes": _at_least(1),
    "steps": _at_least(1),
    "groups_per_step": _at_least(1),
    "group_size": Domain(lambda x: 2 <= x < 2**63, ">= 2 (a group baseline needs two)"),
    "seed": Domain(lambda x: 0 <= x < 2**64, "in 0..2**64-1"),
    "resample": _at_least(0),
    "latency_penalty": FINITE_NON_NEGATIVE,
    "advantage.turns": _at_least(1),
    "advantage.samples": _at_least(1),
    "advantage.horizon": FINITE_NON_NEGATIVE,
    "commons.size": _at_least(1),
    "commons.entries": _at_least(1),
    "commons.reruns": _at_least(1),
    "commons.discount": Domain(lambda x: 0 <= x <= 1, "in [0, 1]"),
    "learning_rate": FINITE_POSITIVE,
    "clip": Domain(lambda x: 0 < x < 1, "in (0, 1)"),
    "normaliser": FINITE_POSITIVE,
    "entropy_coef": FINITE_NON_NEGATIVE,
    "kl_coef": FINITE_NON_NEGATIVE,
    "max_grad_norm": FINITE_POSITIVE,
    "chunk": _at_least(1),
    "chunk_tokens": _at_least(0),
    "weight_decay": FINITE_NON_NEGATIVE,
    "lag": _at_least(0),
    "max_staleness": _at_least(0),
    "concurrency": _at_least(1),
    "channel_capacity": _at_least(1),
    "model.lora_rank": _at_least(0),
    "model.lora_alpha": FINITE_POSITIVE,
    "model.logit_chunk": _at_least(1),
    "model.batch": _at_least(1),
    "model.top_p": Domain(lambda x: 0 < x <= 1, "in (0, 1]"),
    "temperature": FINITE_POSITIVE,
    "max_output_tokens": _at_least(1),
    "snapshot_every": _at_least(1),
}


def check(struct: msgspec.Struct, where: str) -> None:
    """Each of ``struct``'s numbers against its domain (``DOMAINS[where + name]``)."""
    for name in struct.__struct_fields__:
        domain = DOMAINS.get(f"{where}{name}")
        if domain is not None and not domain.holds(value := getattr(struct, name)):
            raise ValueError(f"train config: {where}{name} must be {domain.says}, not {value!r}")

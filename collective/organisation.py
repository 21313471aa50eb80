"""Organisations: who exists, who may talk to whom, who may hire, which policy each runs.

An organisation is a policy-free rule book the conductor consults. It never holds state of its
own during an episode; everything it decides is a function of roles, groups and ids, so
decisions are deterministic and cheap (no per-pair tables: a thousand agents cost nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

PRIMITIVES = ("msg", "post", "read", "put", "search", "wait", "hire", "fire")


class Organisation:
    """Flat by default: everyone from the start, everyone may message everyone, one shared
    channel ``all``. With a budget, any agent may hire (and fire what was hired) up to it."""

    name: ClassVar[str] = "flat"

    def __init__(self, budget: int = 0) -> None:
        if budget < 0:
            raise ValueError(f"organisation {self.name!r}: budget must be >= 0, got {budget}")
        self.budget = budget

    def groups(self, n_agents: int) -> list[int]:
        """How many agents each world instance gets; one group shares one world."""
        return [n_agents]

    def variant_seed(self, group: int, world_seed: int) -> int:
        """The seed of a group's world: the same task for everyone unless overridden."""
        return world_seed

    def role(self, agent: int, n_agents: int) -> str:
        """The role of an agent the organisation starts with."""
        return "worker"

    def channels(self, role: str, group: int) -> tuple[str, ...]:
        """Channels an agent subscribes to and may post on or read."""
        return ("all",)

    def primitives(self, role: str) -> tuple[str, ...]:
        base = ("msg", "post", "read", "put", "search", "wait")
        return (*base, "hire", "fire") if self.hire_roles(role) else base

    def hire_roles(self, role: str) -> tuple[str, ...]:
        """Roles an agent of this role may hire (empty: may not hire)."""
        return ("worker",) if self.budget > 0 else ()

    def may_message(self, sender_group: int, recipient_group: int) -> bool:
        return True

    def policy_of(self, role: str) -> str:
        """Which policy answers this role: ``trained`` (the one RLCR updates) or ``frozen``."""
        return "trained"

    def combine(self, scores: Sequence[float]) -> float:
        """The episode's score from its groups' world scores."""
        return sum(scores) / len(scores)

    def finished(self, done: Sequence[bool]) -> bool:
        return all(done)


ORGANISATIONS: dict[str, type[Organisation]] = {"flat": Organisation}


def register_organisation(cls: type[Organisation]) -> type[Organisation]:
    ORGANISATIONS[cls.name] = cls
    return cls


def make_organisation(name: str, budget: int = 0) -> Organisation:
    try:
        cls = ORGANISATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown organisation {name!r}; organisations are: {', '.join(sorted(ORGANISATIONS))}"
        ) from None
    return cls(budget)

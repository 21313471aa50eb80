"""Organisations: who exists, who may talk to whom, who may hire, which policy each runs.

An organisation is a policy-free rule book the conductor consults. It never holds state of its
own during an episode; everything it decides is a function of roles, groups and ids, so
decisions are deterministic and cheap (no per-pair tables: a thousand agents cost nothing).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import ClassVar

from collective.base.primitives import BASIC, NAMES, PRIMITIVES  # noqa: F401 (train.py reads it here)
from collective.base.seeding import derive


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

    def roles(self) -> tuple[str, ...]:
        """Every role an agent of this organisation can have (started or hired): what
        ``role_policies`` training gives a policy each."""
        return ("worker",)

    def channels(self, role: str, group: int) -> tuple[str, ...]:
        """Channels an agent subscribes to and may post on or read."""
        return ("all",)

    def primitives(self, role: str) -> tuple[str, ...]:
        """The primitives a role has (``collective.base.primitives``): hiring ones only if it
        may."""
        return NAMES if self.hire_roles(role) else BASIC

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

    def like_flat(self, one_policy: bool) -> str:
        """Why this organisation, as configured, would play exactly as ``flat`` does (only the
        role names differ), or "" when it would not. ``one_policy``: the trained and the
        frozen policy are the same (``collective run`` has one ``--policy``)."""
        return ""


ORGANISATIONS: dict[str, type[Organisation]] = {"flat": Organisation}


def register_organisation(cls: type[Organisation]) -> type[Organisation]:
    ORGANISATIONS[cls.name] = cls
    return cls


@register_organisation
class Ceo(Organisation):
    """One CEO (agent 0) who alone may hire and fire specialists, up to ``budget`` alive at once.

    Agents beyond the first start as specialists the CEO did not hire (they do not count against
    the budget and cannot be fired). Everyone may message anyone and shares the channel ``all``.
    """

    name: ClassVar[str] = "ceo"

    def role(self, agent: int, n_agents: int) -> str:
        return "ceo" if agent == 0 else "specialist"

    def roles(self) -> tuple[str, ...]:
        return ("ceo", "specialist")

    def hire_roles(self, role: str) -> tuple[str, ...]:
        return ("specialist",) if role == "ceo" and self.budget > 0 else ()

    def like_flat(self, one_policy: bool) -> str:
        if self.budget:
            return ""
        return (
            "--org ceo without --budget plays as flat does (the CEO cannot hire); give --budget K"
        )


@register_organisation
class Orchestrator(Organisation):
    """An orchestrator (agent 0, the ``trained`` policy) hands tasks to sub-agents that run the
    ``frozen`` policy and report back; only the orchestrator's turns are training data.

    Every other starting agent is a sub-agent from the start, so ``--agents N`` gives N - 1 of
    them; with a budget the orchestrator may hire (and fire) more, up to ``budget`` alive at once.
    Tasks and reports travel as direct messages; everyone shares the channel ``all``.

    ``orchestrator:trained``: the sub-agents run the ``trained`` policy too, and their turns are
    training data (with ``role_policies``, each role trains its own policy).
    """

    name: ClassVar[str] = "orchestrator"

    def __init__(self, budget: int = 0, option: str = "") -> None:
        super().__init__(budget)
        if option not in ("", "trained"):
            raise ValueError(
                f"organisation 'orchestrator:{option}': the one option is 'trained' (the "
                "sub-agents run the trained policy)"
            )
        self.subs_trained = option == "trained"

    def role(self, agent: int, n_agents: int) -> str:
        return "orchestrator" if agent == 0 else "sub"

    def roles(self) -> tuple[str, ...]:
        return ("orchestrator", "sub")

    def hire_roles(self, role: str) -> tuple[str, ...]:
        return ("sub",) if role == "orchestrator" and self.budget > 0 else ()

    def policy_of(self, role: str) -> str:
        return "frozen" if role == "sub" and not self.subs_trained else "trained"

    def like_flat(self, one_policy: bool) -> str:
        if self.budget or not one_policy:
            return ""
        return (
            "--org orchestrator with one policy for both roles and no --budget plays as flat "
            "does (the sub-agents run the orchestrator's policy; nobody hires)"
        )


@register_organisation
class Islands(Organisation):
    """Groups of agents, each given its own variant of the task (its own world, seeded apart),
    talking only within the group: a channel ``g<k>`` per group, no messages across groups. The
    best group's score is the episode's, and the episode ends when any group finishes.

    ``islands`` makes 2 groups; ``islands:K`` makes K (never more than there are agents). Agents
    are dealt to groups as evenly as possible, the first groups taking the remainder.
    """

    name: ClassVar[str] = "islands"

    def __init__(self, budget: int = 0, option: str = "") -> None:
        super().__init__(budget)
        if option and not (option.isdigit() and int(option) >= 1):
            raise ValueError(
                f"organisation '{self.name}:{option}': the option is the number of groups, "
                "a whole number >= 1"
            )
        self.n_groups = int(option) if option else 2

    def groups(self, n_agents: int) -> list[int]:
        k = min(self.n_groups, n_agents)
        return [n_agents // k + (1 if g < n_agents % k else 0) for g in range(k)]

    def variant_seed(self, group: int, world_seed: int) -> int:
        # Group 0 keeps the config's seed, so islands:1 plays the same task as flat.
        return world_seed if group == 0 else derive(world_seed, group) >> 1

    def channels(self, role: str, group: int) -> tuple[str, ...]:
        return (f"g{group}",)

    def may_message(self, sender_group: int, recipient_group: int) -> bool:
        return sender_group == recipient_group

    def combine(self, scores: Sequence[float]) -> float:
        return max(scores)

    def finished(self, done: Sequence[bool]) -> bool:
        return any(done)

    def like_flat(self, one_policy: bool) -> str:
        if self.n_groups > 1:
            return ""
        return f"{self.name}:1 is one group, which plays as flat does (on a channel named g0)"


@register_organisation
class IslandsMean(Islands):
    """``islands_mean:K``: the islands, scored as the mean over groups and ended when all are
    done. (``islands`` takes the best group, whose score rises with the number of groups by
    selection alone: a study of scale that compares teams of islands wants the mean.)"""

    name: ClassVar[str] = "islands_mean"

    def combine(self, scores: Sequence[float]) -> float:
        return sum(scores) / len(scores)

    def finished(self, done: Sequence[bool]) -> bool:
        return all(done)


def make_organisation(name: str, budget: int = 0) -> Organisation:
    """``NAME`` or ``NAME:OPTION`` (e.g. ``islands:4``); only some organisations take an option."""
    base, sep, option = name.partition(":")
    try:
        cls = ORGANISATIONS[base]
    except KeyError:
        raise ValueError(
            f"unknown organisation {name!r}; organisations are: {', '.join(sorted(ORGANISATIONS))}"
        ) from None
    if not sep:
        return cls(budget)
    if "option" not in inspect.signature(cls.__init__).parameters:
        raise ValueError(f"organisation {base!r} takes no option, got {name!r}")
    return cls(budget, option)  # type: ignore[call-arg]

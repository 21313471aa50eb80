"""The cast: who is in an episode. Its organisation, its worlds (one per group), every agent's
engine-wide id, each role's action space, and the rules of hiring and firing.

It holds no clock and runs nothing, so anything that needs an episode's worlds and action
spaces exactly as the engine builds them can make one (``bench/baselines.py`` steps the same
world with asyncio and SimPy). ``LiveEpisode`` owns one and records what it decides.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from collective.base.actions import ActionSpace
from collective.base.primitives import primitive_specs
from collective.engine.organisation import make_organisation
from collective.engine.registry import make_world
from collective.world import World, WorldBug

if TYPE_CHECKING:
    from collective.engine.actor import Actor
    from collective.records import EpisodeConfig


class Cast:
    def __init__(self, cfg: EpisodeConfig) -> None:
        self.cfg = cfg
        self.org = make_organisation(cfg.org, cfg.budget)
        sizes = self.org.groups(cfg.agents)
        if sum(sizes) != cfg.agents or min(sizes) < 1:
            raise ValueError(f"organisation {cfg.org!r} split {cfg.agents} agents into {sizes}")
        world_sizes = sizes
        if cfg.world_agents:
            if len(sizes) != 1:
                raise ValueError(f"world_agents needs a one-group organisation, not {cfg.org!r}")
            world_sizes = [cfg.world_agents]  # sized for the team it may grow into by hiring
        self.worlds: list[World] = [
            make_world(cfg.world, n, self.org.variant_seed(g, cfg.world_seed), cfg.params)
            for g, n in enumerate(world_sizes)
        ]
        self.group_of = {id(w): g for g, w in enumerate(self.worlds)}
        self.group_sizes = list(sizes)
        # A world posts on the channels its group's agents share.
        firsts = [sum(sizes[:g]) for g in range(len(sizes))]
        self.world_channels = [
            self.org.channels(self.org.role(first, cfg.agents), g) for g, first in enumerate(firsts)
        ]
        self.world_specs = [w.tool_specs() for w in self.worlds]
        self.words = tuple(dict.fromkeys(w for world in self.worlds for w in world.lexicon))
        self.spaces: dict[tuple[str, int, int], ActionSpace] = {}
        self.actors: dict[int, Actor] = {}  # every agent ever in the episode, by id
        self.next_id = 0
        self.id_limit = cfg.agents  # ids agents may address: grows with each hire
        self.alive = 0
        self.hired_alive = 0
        self.hirer: dict[int, int] = {}  # hired agent -> who hired it

    def starting(self) -> Iterator[tuple[str, int, int]]:
        """The agents the organisation starts with: (role, group, id in the group's world)."""
        n = self.cfg.agents
        start = 0
        for g, size in enumerate(self.group_sizes):
            for local in range(size):
                yield self.org.role(start + local, n), g, local
            start += size

    def space_for(self, role: str, group: int) -> ActionSpace:
        """The action space of a role in a group: its world's tools, then its primitives.
        Rebuilt only when the set of ids grows (a hire)."""
        key = (role, group, self.id_limit)
        space = self.spaces.get(key)
        if space is None:
            org = self.org
            prims = primitive_specs(
                org.primitives(role),
                id_limit=self.id_limit,
                channels=org.channels(role, group),
                hire_roles=org.hire_roles(role),
                max_wait=self.cfg.max_wait,
                words=self.words,
            )
            space = ActionSpace(self.world_specs[group] + prims)
            self.spaces = {k: v for k, v in self.spaces.items() if k[2] == self.id_limit}
            self.spaces[key] = space
        return space

    def new_id(self, group: int, local: int) -> int:
        """The next engine-wide id, for agent ``local`` of ``group``'s world."""
        agent_id = self.next_id
        self.next_id += 1
        self.worlds[group]._seat(local, agent_id)
        return agent_id

    def enter(self, actor: Actor) -> None:
        self.actors[actor.id] = actor
        self.alive += 1

    def exit(self, actor: Actor) -> None:
        """An agent's program ended (or it was fired): it no longer counts as alive."""
        if actor.alive:
            actor.alive = False
            self.alive -= 1

    def hire(self, by: Actor, role: str) -> tuple[int, int] | str:
        """Make room for a hire by ``by``: its (group, id in the group's world), or why not.
        The new agent's world has ``join`` called; a world that raises there is a bug."""
        if role not in self.org.hire_roles(by.role):
            return f"error: a {by.role} may not hire a {role}"
        if self.hired_alive >= self.org.budget:
            return f"error: hiring budget of {self.org.budget} reached; fire someone first"
        group = by.group
        local = self.group_sizes[group]
        self.group_sizes[group] += 1
        world = self.worlds[group]
        try:
            world.join(local)
        except Exception as e:
            raise WorldBug(world, "join", e, agent=by.id) from e
        self.id_limit = max(self.id_limit, self.next_id + 1)
        return group, local

    def hired(self, by: Actor, new: Actor) -> None:
        self.hirer[new.id] = by.id
        self.hired_alive += 1

    def fire(self, by: Actor, target_id: int) -> Actor | str:
        """Fire ``target_id`` on ``by``'s word: the agent fired, or why not. Only an agent's
        hirer may fire it. (Then ``leave``.)"""
        target = self.actors.get(target_id)
        if target is None or not target.alive:
            return f"error: there is no agent {target_id}"
        if self.hirer.get(target_id) != by.id:
            return f"error: you may only fire agents you hired; {target_id} is not one"
        self.exit(target)
        self.hired_alive -= 1
        return target

    def leave(self, by: Actor, target: Actor) -> None:
        """A fired agent leaves its world; a world that raises there is a bug."""
        world = self.worlds[target.group]
        try:
            world.leave(target.local)
        except Exception as e:
            raise WorldBug(world, "leave", e, agent=by.id) from e

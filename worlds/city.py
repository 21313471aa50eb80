"""The city: the workshop in blocks of 8 whose task, keys and desks scale with the team.

A policy trained as a village (a team of at most 8) meets, at n agents, a world in which nothing
a village sees changes with n (:class:`CityWorkshop`):

- task ∝ n: 4 modules per agent (32 for a village of 8, 256 at 64), one dependency graph over
  them all (a module may depend on modules of other blocks: the city is one project);
- keys ∝ n: each block has ``KEYS_PER_BLOCK`` keys (fewer in a block smaller than that), each
  held at the start by one of its agents, and a block's key-gated modules need one of its own
  keys, so the key-gated work per holder is the same at every n;
- desks ∝ n: module m belongs to block ``m mod blocks``; an agent's desk shows up to ``view``
  ready modules of its own block, chosen as the workshop chooses them, so a module's key holder
  sees it with a chance independent of n.

What still grows with n: the one channel ``all`` every post reaches, direct messages to anyone,
and dependencies across blocks. At n <= 8 (or ``block = 0``) the world is one block: the plain
workshop's desks. :class:`CityPublicKeys` is the city with key gating removed. The controlled
village-to-city study (:mod:`experiments.city`) deploys a village policy in them (its
islands condition is the built-in ``islands_mean`` organisation: islands scored by their mean).
"""

from __future__ import annotations

from typing import Any

from worlds.workshop import Workshop

BLOCK = 8  # agents per block: the village
KEYS_PER_BLOCK = 4


class CityWorkshop(Workshop):
    """The workshop in blocks of ``block`` agents (0: one block of everyone), its keys and desks
    local to a block; see the module docstring for how each part scales with the team."""

    def __init__(self, n_agents: int = 1, seed: int = 0, block: int = BLOCK, **params: Any) -> None:
        if block < 0:
            raise ValueError(f"CityWorkshop: block must be >= 0 (0: one block), got {block}")
        params.setdefault("holders", "slots")
        super().__init__(n_agents, seed, **params)
        rng = self.rng
        self.block = block or n_agents
        self.blocks = -(-n_agents // self.block)
        keys: list[list[int]] = []
        self.holder = []
        for b in range(self.blocks):
            members = list(range(b * self.block, min(n_agents, (b + 1) * self.block)))
            held = rng.sample(members, min(KEYS_PER_BLOCK, len(members)))
            keys.append(list(range(len(self.holder), len(self.holder) + len(held))))
            self.holder += held
        self.n_keys = len(self.holder)
        self.key_of = [
            rng.choice(keys[m % self.blocks]) if k >= 0 else -1 for m, k in enumerate(self.key_of)
        ]
        self.lexicon = (*Workshop.lexicon, *(f"k{j}" for j in range(self.n_keys)))
        self.known = {}
        for j, a in enumerate(self.holder):
            self.known.setdefault(a, set()).add(j)

    def _desk(self, agent: int) -> tuple[int, ...]:
        """Up to ``view`` ready modules of the agent's own block, picked as the workshop picks
        from all of them (its own module first, then strided by its place in the block). Costs
        O(ready modules), which the study's sizes afford."""
        b = agent // self.block
        ready = [m for m in self.ready if m % self.blocks == b]
        if not ready:
            return ()
        members = min(self.block, self.n_agents - b * self.block)
        cur = self.current.get(agent, -1)
        desk = [cur] if cur in self.pos and cur % self.blocks == b else []
        return self._strided(ready, agent - b * self.block, members, desk)


class CityPublicKeys(CityWorkshop):
    """The city with every key public from the start: nobody is ever refused for a key."""

    def __init__(self, n_agents: int = 1, seed: int = 0, **params: Any) -> None:
        super().__init__(n_agents, seed, **params)
        self.public = set(range(self.n_keys))

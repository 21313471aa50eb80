"""wildfire: fires break out at seeded times, and each must be put out before it burns down.

The forest has ``patches`` patches per agent. ``fires`` fires per agent break out at seeded
times in the first ``horizon`` seconds, each on its own patch: the world schedules them itself
(``self.at``), so they break out whatever the agents are doing, and each one is posted on the
channel, which wakes agents that wait for news. ``douse PATCH`` takes ``douse_seconds``; a fire
not doused within ``burn_seconds`` of breaking out burns its patch down (another world event)
and is lost. The score is the share of all the episode's fires put out: it never falls, and the
episode ends once every fire is out or lost.

Fires overlap, so a team that spreads over them saves more than one that crowds onto the same
fire (the second to arrive finds it out: wasted time, counted in ``duplicates``). Every agent
sees up to ``view`` burning patches, the most urgent first, each agent's list starting at a
different one of the most urgent, so a team sees them all between its members.
"""

from __future__ import annotations

import itertools
from typing import Annotated

from collective.world import Range, ToolError, World, tool


class Wildfire(World):
    monotone = True
    lexicon = ("fire", "out", "mine", "burning", "help", "lost", "taking")

    def __init__(
        self,
        n_agents: int = 1,
        seed: int = 0,
        fires: int = 3,
        patches: int = 6,
        horizon: float = 240.0,
        burn_seconds: float = 60.0,
        douse_seconds: float = 5.0,
        view: int = 3,
    ) -> None:
        """``fires`` fires per agent break out in the first ``horizon`` seconds on a forest of
        ``patches`` patches per agent; each burns down ``burn_seconds`` after breaking out
        unless doused (``douse_seconds``); agents see up to ``view`` burning patches."""
        super().__init__(n_agents, seed)
        checks = [
            (fires >= 1, f"fires must be >= 1, got {fires}"),
            (patches >= fires, f"patches must be >= fires ({fires}), got {patches}"),
            (horizon >= 0, f"horizon must be >= 0, got {horizon}"),
            (burn_seconds > 0, f"burn_seconds must be > 0, got {burn_seconds}"),
            (douse_seconds >= 0, f"douse_seconds must be >= 0, got {douse_seconds}"),
            (1 <= view <= 9, f"view must be in 1..9, got {view}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"Wildfire: {msg}")
        self.patches = patches * n_agents
        self.last = self.patches - 1
        self.fires = fires * n_agents
        self.burn_seconds, self.douse_seconds, self.view = burn_seconds, douse_seconds, view
        self.burning: dict[int, float] = {}  # patch -> when it burns down, in order of outbreak
        self.out = self.lost = self.duplicates = 0
        self.burnt = bytearray(self.patches)
        where = self.rng.sample(range(self.patches), self.fires)
        for patch in where:
            self.at(round(self.rng.uniform(0, horizon), 1), self.ignite, patch)

    def ignite(self, patch: int) -> None:
        """A world event: a fire breaks out, and will burn the patch down unless doused."""
        self.burning[patch] = self.now + self.burn_seconds
        self.after(self.burn_seconds, self.burn_down, patch)
        self.post(f"fire at p{patch}")

    def burn_down(self, patch: int) -> None:
        """A world event: if the fire is still burning, the patch is lost."""
        if self.burning.pop(patch, None) is not None:
            self.burnt[patch] = 1
            self.lost += 1
            self.post(f"p{patch} burnt down")

    @tool(duration="douse_seconds")
    def douse(self, agent: int, patch: Annotated[int, Range(0, "last")]) -> str:
        """put out the fire on a patch"""
        if self.burnt[patch]:
            raise ToolError(f"p{patch} has burnt down: fight a fire that still burns")
        if self.burning.pop(patch, None) is None:
            self.duplicates += 1
            raise ToolError(f"p{patch} is not burning")
        self.out += 1
        return f"p{patch} is out ({self.out} of {self.fires} fires out)"

    def observe(self, agent: int) -> str:
        # Fires burn down in the order they broke out, the dict's order: the first are the most
        # urgent. Each agent's list starts at its own one of them: O(view), at any scale.
        urgent = list(itertools.islice(self.burning, 2 * self.view))
        if urgent:
            k = agent % len(urgent)
            shown = (urgent[k:] + urgent[:k])[: self.view]
            fires = ", ".join(f"p{p} burns down at {self.burning[p]:.0f}s" for p in shown)
        else:
            fires = "no fire burns"
        return f"t={self.now:.0f}s, out {self.out}, lost {self.lost} of {self.fires}. {fires}"

    def score(self) -> float:
        return self.out / self.fires

    def done(self) -> bool:
        return self.out + self.lost == self.fires

    def metrics(self) -> dict[str, float]:
        return {"out": self.out, "lost": self.lost, "duplicates": self.duplicates}

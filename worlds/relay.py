"""relay: hidden information that only pays once it is put together.

The answer has ``size`` parts per agent. Each part is two syllables, like ``ka mo``; one agent
holds its start and another agent its end, and each agent sees only the halves it holds and who
holds the other halves. ``submit PART FIRST SECOND`` scores the part if both syllables are
right, so the halves must be brought together by a message (or a post) first. The score is the
fraction of parts solved; it never falls. A solo agent holds both halves of every part.

An agent sees its unsolved halves, at most ``view`` of them, so an observation stays short
whatever the size of the collective.
"""

from __future__ import annotations

from typing import Annotated

from collective.world import OneOf, Range, ToolError, World, tool

SYLLABLES = ("ka", "mo", "ri", "te", "su", "no", "ha", "lu")


class Relay(World):
    monotone = True
    lexicon = (*SYLLABLES, "start", "end", "part", "have", "need", "solved")

    def __init__(
        self,
        n_agents: int = 1,
        seed: int = 0,
        size: int = 2,
        view: int = 3,
        submit_seconds: float = 5.0,
    ) -> None:
        """``size`` parts per agent; ``view`` halves shown at a time; ``submit`` takes
        ``submit_seconds``."""
        super().__init__(n_agents, seed)
        if size < 1:
            raise ValueError(f"Relay: size must be >= 1, got {size}")
        if not 1 <= view <= 9:
            raise ValueError(f"Relay: view must be in 1..9, got {view}")
        if not submit_seconds > 0:
            raise ValueError(f"Relay: submit_seconds must be > 0, got {submit_seconds}")
        self.view, self.submit_seconds = view, submit_seconds
        self.parts = size * n_agents
        self.syllables = SYLLABLES
        rng = self.rng
        self.answer = [(rng.choice(SYLLABLES), rng.choice(SYLLABLES)) for _ in range(self.parts)]
        # Part p's start is held by agent p % n, its end by another agent at a random distance.
        self.start_of = [p % n_agents for p in range(self.parts)]
        self.end_of = [
            (a + rng.randrange(1, n_agents)) % n_agents if n_agents > 1 else a
            for a in self.start_of
        ]
        self.halves: list[list[tuple[int, int]]] = [[] for _ in range(n_agents)]  # (part, 0|1)
        for p in range(self.parts):
            self.halves[self.start_of[p]].append((p, 0))
            self.halves[self.end_of[p]].append((p, 1))
        self.solved = bytearray(self.parts)
        self.n_solved = 0
        self.wrong = 0

    def observe(self, agent: int) -> str:
        shown = []
        for p, half in self._unsolved(agent):
            if half == 0:
                other = self.agent_id(self.end_of[p])
                shown.append(f"p{p} starts {self.answer[p][0]} (end: agent {other})")
            else:
                other = self.agent_id(self.start_of[p])
                shown.append(f"p{p} ends {self.answer[p][1]} (start: agent {other})")
        held = "; ".join(shown) if shown else "nothing left to tell"
        return f"solved {self.n_solved}/{self.parts}. you hold: {held}"

    @tool(duration="submit_seconds")
    def submit(
        self,
        agent: int,
        part: Annotated[int, Range(0, lambda w: w.parts - 1)],
        first: Annotated[str, OneOf("syllables")],
        second: Annotated[str, OneOf("syllables")],
    ) -> str:
        """submit both syllables of a part"""
        if self.solved[part]:
            return f"p{part} was already solved"
        if (first, second) != self.answer[part]:
            self.wrong += 1
            raise ToolError(f"p{part} is not {first} {second}")
        self.solved[part] = 1
        self.n_solved += 1
        return f"p{part} solved ({self.n_solved}/{self.parts})"

    def score(self) -> float:
        return self.n_solved / self.parts

    def _unsolved(self, agent: int) -> list[tuple[int, int]]:
        """Up to ``view`` of the agent's halves whose part is unsolved (it holds 2 * size)."""
        halves = self.halves[agent] if agent < self.n_agents else []  # the hired hold nothing
        return [h for h in halves if not self.solved[h[0]]][: self.view]

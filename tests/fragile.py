"""Worlds for tests: tools that misbehave on purpose, and one that awaits mid-commit."""

from __future__ import annotations

from typing import Annotated

import trio

from collective import World
from collective.world import Range, Text, ToolError, tool


class Fragile(World):
    """A world whose tools misbehave on purpose: one raises a bug, one refuses politely."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.progress = 0

    @tool(duration=3.0)
    def step(self, agent: int, n: Annotated[int, Range(1, 2)]) -> str:
        self.progress = min(10, self.progress + n)
        return f"progress {self.progress}"

    @tool(duration=1.0)
    def crash(self, agent: int) -> str:
        raise RuntimeError("the world has a bug")

    @tool(duration=1.0)
    def refuse(self, agent: int, why: Annotated[str, Text(10)]) -> str:
        raise ToolError(f"refused: {why}")

    def observe(self, agent: int) -> str:
        return f"progress {self.progress}"

    def score(self) -> float:
        return self.progress / 10


class Bumps(World):
    """A counter every agent can bump; ``abump`` awaits in the middle of its effect, as a tool
    that runs a real subprocess does (the repo world's ``test``)."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.count = 0

    @tool(duration=1.0)
    def bump(self, agent: int) -> str:
        self.count += 1
        return "ok"

    @tool(duration=1.0)
    async def abump(self, agent: int) -> str:
        await trio.sleep(0)  # the conductor yields here, mid-instant
        self.count += 1
        return "ok"

    def observe(self, agent: int) -> str:
        return f"count {self.count}"

    def score(self) -> float:
        return min(1.0, self.count / 100)

"""A world for tests whose tools misbehave on purpose."""

from __future__ import annotations

from typing import Annotated

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

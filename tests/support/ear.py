"""A test world that reports what the engine tells it: the simulated time of each call, the
engine-wide id of an agent, and every message and post it hears."""

from __future__ import annotations

from typing import Annotated

from collective import Range, World, tool


class Ear(World):
    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.heard_log: list[tuple[int, int | None, str]] = []

    @tool(duration=2.5)
    def clock(self, agent: int) -> str:
        return f"now={self.now:.3f}"

    @tool(duration=1.0)
    def who(self, agent: int, other: Annotated[int, Range(0, 9)]) -> str:
        return f"{other} is agent {self.agent_id(other)}; heard {self.heard_log}"

    def heard(self, sender: int, to: int | None, text: str) -> None:
        self.heard_log.append((sender, to, text))

    def observe(self, agent: int) -> str:
        return f"t={self.now:.3f}"

    def score(self) -> float:
        return 0.0

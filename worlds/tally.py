"""tally: the smallest world that exercises every part of the engine.

A shared counter must reach a target. Each ``add`` takes simulated time, so agents that add in
parallel finish sooner: the smallest case of "a collective that parallelises well earns more".
``sleep`` does real work (a real ``time.sleep``), so ``hybrid`` clock mode has a real duration to
measure and log. The score is the counter over the target, monotone and anytime.
"""

from __future__ import annotations

import time
from typing import Annotated

from collective.world import OneOf, Range, Text, ToolError, World, tool


class Tally(World):
    monotone = True
    lexicon = ("add", "count", "more", "stop", "target", "done")

    def __init__(self, n_agents: int = 1, seed: int = 0, target: int = 0) -> None:
        super().__init__(n_agents, seed)
        if target < 0:
            raise ValueError(f"Tally: target must be >= 0 (0: 10 per agent), got {target}")
        self.target = target or 10 * n_agents  # scales with the collective
        self.count = 0
        self.labels = ("red", "green", "blue")
        self.marks: dict[int, str] = {}

    @tool(duration=10.0)
    def add(self, agent: int, amount: Annotated[int, Range(1, 3)]) -> str:
        """add to the shared counter"""
        self.count = min(self.target, self.count + amount)
        return f"count is {self.count} of {self.target}"

    @tool(duration=2.0)
    def mark(self, agent: int, label: Annotated[str, OneOf("labels")]) -> str:
        """mark yourself with a label"""
        self.marks[agent] = label
        return f"you are {label}"

    @tool(duration=5.0)
    def note(self, agent: int, text: Annotated[str, Text(20)]) -> str:
        """write a short note (it changes nothing)"""
        if "forbidden" in text:
            raise ToolError("that word is not allowed")
        return "noted"

    @tool(duration=1.0)
    def sleep(self, agent: int, ms: Annotated[int, Range(1, 5)]) -> str:
        """do real work for a few milliseconds"""
        time.sleep(ms / 1000)
        return "slept"

    def observe(self, agent: int) -> str:
        return f"agent {agent}: count {self.count} of {self.target}"

    def score(self) -> float:
        return self.count / self.target

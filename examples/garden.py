"""garden: the complete example world of docs/writing-a-world.md.

Beds need watering a few times before they can be harvested; the score is the fraction
harvested. Agents that tend different beds at once finish sooner.
"""

from typing import Annotated

from collective.world import Range, ToolError, World, tool


class Garden(World):
    monotone = True  # a harvest is never undone, so the score never falls
    lexicon = ("water", "ripe", "bed", "mine", "done")  # words worth saying in messages

    def __init__(self, n_agents: int = 1, seed: int = 0, beds_per_agent: int = 3) -> None:
        super().__init__(n_agents, seed)
        if beds_per_agent < 1:
            raise ValueError(f"Garden: beds_per_agent must be >= 1, got {beds_per_agent}")
        self.beds = beds_per_agent * n_agents  # the garden grows with the team
        self.last = self.beds - 1  # the highest bed number, for the tools' domains
        self.thirst = [self.rng.randint(1, 3) for _ in range(self.beds)]  # seeded: self.rng
        self.harvested = [False] * self.beds
        self.done_beds = 0  # kept up to date, so score() is O(1)

    @tool(duration=5.0)
    def water(self, agent: int, bed: Annotated[int, Range(0, "last")]) -> str:
        """water a bed"""
        if self.harvested[bed]:
            raise ToolError(f"bed {bed} is already harvested")
        self.thirst[bed] = max(0, self.thirst[bed] - 1)
        return f"bed {bed} is ripe" if self.thirst[bed] == 0 else f"bed {bed} is still dry"

    @tool(duration=3.0)
    def harvest(self, agent: int, bed: Annotated[int, Range(0, "last")]) -> str:
        """harvest a ripe bed"""
        if self.harvested[bed]:
            raise ToolError(f"bed {bed} is already harvested")
        if self.thirst[bed] > 0:
            raise ToolError(f"bed {bed} is not ripe: it needs {self.thirst[bed]} more water")
        self.harvested[bed] = True
        self.done_beds += 1
        return f"harvested bed {bed}"

    def observe(self, agent: int) -> str:
        near = [(agent * 3 + i) % self.beds for i in range(min(3, self.beds))]
        beds = ", ".join(f"bed {b} {self._state(b)}" for b in near)
        return f"harvested {self.done_beds}/{self.beds}. near you: {beds}"

    def score(self) -> float:
        return self.done_beds / self.beds

    def _state(self, bed: int) -> str:
        if self.harvested[bed]:
            return "harvested"
        return "ripe" if self.thirst[bed] == 0 else f"needs {self.thirst[bed]} water"

"""The bench scenario: a world, an organisation and a policy built to measure the engine.

``Crowd`` is a world whose tools cost almost nothing, so a benchmark times the engine and not
the world, and whose task grows with the number of agents (one cell per agent). The ``city``
organisation has no broadcast channel: agents reach each other by direct message only, so an
agent waiting with no timeout sleeps until someone writes to it, as most residents of a large
city would. ``SparsePolicy`` is the activity knob: a fixed, seeded fraction of the agents run
the random policy; the others answer every turn with ``wait 0`` (wait until a message comes),
so they cost memory while they wait and one turn each time a message wakes them. At activity
1.0 it is exactly the random policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from collective.base.seeding import derive
from collective.engine.organisation import Organisation, register_organisation
from collective.world import Range, World, tool
from policy import tokenizer
from policy.base import PolicyRequest, PolicyResponse
from policy.uniform import sample_action

CROWD = "bench.city:Crowd"
IDLE_ACTION = "wait 0"


class Crowd(World):
    """Fill every cell to ``target``; the score is the fraction of full cells."""

    monotone = True
    lexicon = ("cell", "fill", "help", "done", "next", "mine", "full", "look")

    def __init__(
        self, n_agents: int = 1, seed: int = 0, cells_per_agent: int = 1, target: int = 3
    ) -> None:
        super().__init__(n_agents, seed)
        if cells_per_agent < 1 or target < 1:
            raise ValueError(
                f"Crowd: cells_per_agent and target must be >= 1, got {cells_per_agent}, {target}"
            )
        self.n_cells = cells_per_agent * n_agents
        self.last_cell = self.n_cells - 1
        self.target = target
        self.level = bytearray(self.n_cells)  # one byte a cell: the task scales, cheaply
        self.full = 0

    @tool(duration=4.0)
    def fill(self, agent: int, cell: Annotated[int, Range(0, "last_cell")]) -> str:
        """add one unit to a cell"""
        if self.level[cell] < self.target:
            self.level[cell] += 1
            if self.level[cell] == self.target:
                self.full += 1
        return f"cell {cell} at {self.level[cell]}"

    @tool(duration=1.0)
    def look(self, agent: int, cell: Annotated[int, Range(0, "last_cell")]) -> str:
        """read a cell"""
        return f"cell {cell} at {self.level[cell]} of {self.target}"

    def observe(self, agent: int) -> str:
        return f"agent {agent}: {self.full} of {self.n_cells} cells full"

    def score(self) -> float:
        return self.full / self.n_cells


@register_organisation
class CityOrganisation(Organisation):
    """Flat, but without the shared channel: direct messages and the archive only."""

    name = "city"

    def channels(self, role: str, group: int) -> tuple[str, ...]:
        return ()


class SparsePolicy:
    """The random policy for a seeded ``activity`` fraction of the agents (and always for the
    first ``pinned`` ids); ``wait 0`` for the rest. Whether an agent is active depends only on
    its id, so the choice is the same in any batch, any process and on replay."""

    def __init__(self, activity: float = 1.0, salt: int = 0, pinned: int = 0) -> None:
        if not 0.0 <= activity <= 1.0:
            raise ValueError(f"SparsePolicy: activity must be in [0, 1], got {activity}")
        if pinned < 0:
            raise ValueError(f"SparsePolicy: pinned must be >= 0, got {pinned}")
        self.activity = activity
        self.salt = salt
        self.pinned = pinned
        self.name = f"sparse({activity:g}, pinned {pinned}) over random"
        self.version = 0
        self._threshold = int(activity * 2**64)
        self._idle_ids = [*tokenizer.encode(IDLE_ACTION), tokenizer.EOS]

    def active(self, agent: int) -> bool:
        return (
            self.activity >= 1.0
            or agent < self.pinned
            or derive(self.salt, agent) < self._threshold
        )

    def answer(self, r: PolicyRequest) -> PolicyResponse:
        """One request's answer, synchronously (what the batch call does for each)."""
        if self.active(r.agent):  # exactly what RandomPolicy answers
            text, ids, lps = sample_action(r)
        else:  # a deterministic choice: probability one
            text, ids = IDLE_ACTION, list(self._idle_ids)
            lps = [0.0] * len(ids)
        return PolicyResponse(
            text=text, token_ids=ids, logprobs=lps, prompt_tokens=tokenizer.count(r.prompt)
        )

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        return [self.answer(r) for r in requests]

    async def aclose(self) -> None:
        return None

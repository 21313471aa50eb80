"""Open Reward Standard environments written for the tests, and a server for them on loopback.

``Tiles``: a task is a set of target tiles; ``look`` (concurrent, no reward) says whether a tile
is a target, ``flip`` (serialised) earns 0.2 for each target flipped the first time, and the
terminal ``submit`` earns 1 for the right count of targets and finishes the task. ``Broken``
misbehaves as its split says: ``raise``s, rewards 1.5, or NaN. ``Late`` rewards only when its
terminal tool finishes the task.

Run as ``python -m tests.support.ors_envs PORT`` it serves them on 127.0.0.1 only.
"""

from __future__ import annotations

import math
import sys

from openreward.environments import Environment, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel, Field


class Tile(BaseModel):
    tile: int = Field(ge=0, le=5)


class Answer(BaseModel):
    answer: str


TASKS = [{"targets": [1, 4]}, {"targets": [0, 2, 5]}, {"targets": [3]}]


class Tiles(Environment):
    def __init__(self, task_spec: dict = {}, secrets: dict = {}) -> None:  # noqa: B006
        super().__init__(task_spec, secrets)
        self.targets = set(task_spec["targets"])
        self.flipped: set[int] = set()

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return TASKS if split == "train" else TASKS[:1]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Find the target tiles among 0..5, flip them, submit their count.")]

    @tool(concurrent=True)
    async def look(self, args: Tile) -> ToolOutput:
        """is a tile a target?"""
        hit = "a target" if args.tile in self.targets else "not a target"
        return ToolOutput(blocks=[TextBlock(text=f"tile {args.tile} is {hit}")])

    @tool
    async def flip(self, args: Tile) -> ToolOutput:
        """flip a tile"""
        new = args.tile in self.targets and args.tile not in self.flipped
        self.flipped.add(args.tile)
        return ToolOutput(
            blocks=[TextBlock(text=f"flipped {args.tile}")], reward=0.2 if new else 0.0
        )

    @terminal
    @tool
    async def submit(self, args: Answer) -> ToolOutput:
        """submit the number of targets"""
        right = args.answer.strip() == str(len(self.targets))
        return ToolOutput(
            blocks=[TextBlock(text="right" if right else "wrong")],
            reward=1.0 if right else 0.0,
            finished=True,
        )


class Broken(Environment):
    def __init__(self, task_spec: dict = {}, secrets: dict = {}) -> None:  # noqa: B006
        super().__init__(task_spec, secrets)
        self.how = task_spec["how"]

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["raise", "big", "nan"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"how": split}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="poke it")]

    @tool
    async def poke(self, args: Tile) -> ToolOutput:
        """poke"""
        if self.how == "raise":
            raise RuntimeError("the grader fell over")
        reward = 1.5 if self.how == "big" else math.nan
        return ToolOutput(blocks=[TextBlock(text="poked")], reward=reward)


class Late(Environment):
    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="say when")]

    @tool
    async def ping(self, args: Tile) -> ToolOutput:
        """ping"""
        return ToolOutput(blocks=[TextBlock(text="pong")])

    @tool
    async def finish(self, args: Tile) -> ToolOutput:
        """finish"""
        return ToolOutput(
            blocks=[TextBlock(text="over")], reward=float(args.tile == 3), finished=True
        )


class Amount(BaseModel):
    amount: float


class Wide(Environment):
    """A tool whose schema no action can carry: an unbounded number."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="pay")]

    @tool
    async def pay(self, args: Amount) -> ToolOutput:
        """pay"""
        return ToolOutput(blocks=[TextBlock(text="paid")])


def main(port: int) -> None:
    import uvicorn
    from openreward.environments import Server

    server = Server([Tiles, Broken, Late])
    uvicorn.run(server.app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(int(sys.argv[1]))

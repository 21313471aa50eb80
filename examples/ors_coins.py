"""coins: the Open Reward Standard environment of docs/ors.md, trained by a collective."""

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel, Field

TASKS = [{"coins": [1, 4]}, {"coins": [0, 2, 5]}, {"coins": [3]}, {"coins": [0, 5]}]


class Box(BaseModel):
    box: int = Field(ge=0, le=5)


class Coins(Environment):
    def __init__(self, task_spec: dict = {}, secrets: dict = {}) -> None:  # noqa: B006
        super().__init__(task_spec, secrets)
        self.coins = set(task_spec["coins"])
        self.found: set[int] = set()

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return TASKS

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Six boxes, 0..5; some hold a coin. Open them all.")]

    @tool(concurrent=True)
    async def shake(self, args: Box) -> ToolOutput:
        """shake a box: does it rattle?"""
        rattles = args.box in self.coins - self.found
        return ToolOutput(blocks=[TextBlock(text="it rattles" if rattles else "it is quiet")])

    @tool
    async def open(self, args: Box) -> ToolOutput:
        """open a box and take its coin"""
        new = args.box in self.coins - self.found
        self.found |= {args.box} & self.coins
        text = f"box {args.box}: {'a coin' if new else 'nothing'}"
        reward = 1 / len(self.coins) if new else 0.0
        return ToolOutput(
            blocks=[TextBlock(text=text)], reward=reward, finished=self.found == self.coins
        )

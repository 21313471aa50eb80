"""A scripted policy for tests and demonstrations: a plain function decides each action.

It stands in for a model where a test needs exact control of what agents do. Token ids are the
action's bytes; logprobs are zero (the script is deterministic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from policy import tokenizer
from policy.base import PolicyRequest, PolicyResponse

Script = Callable[[PolicyRequest], str]


class ScriptedPolicy:
    def __init__(self, script: Script, name: str = "scripted") -> None:
        self.script = script
        self.name = name
        self.version = 0
        self.batches: list[int] = []  # the size of every batch it was asked, for tests

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        self.batches.append(len(requests))
        out = []
        for r in requests:
            text = self.script(r)
            ids = [*tokenizer.encode(text), tokenizer.EOS]
            out.append(
                PolicyResponse(
                    text=text,
                    token_ids=ids,
                    logprobs=[0.0] * len(ids),
                    prompt_tokens=tokenizer.count(r.prompt),
                    version=0,
                )
            )
        return out

    async def aclose(self) -> None:
        return None

"""Replay's policy: answers from an episode's recorded turns, never calling a model.

For a fork, requests asked at or after ``until`` go to a live policy instead, so an episode can
be replayed exactly up to a moment and then continued with another policy ("what if, from here
on, ...").

The turns are read as the requests come (they may be a pass over an episode file; see
``collective.records.TurnFinder``). It lives on the engine's side, beside the records it reads
(``replay`` and ``credit`` drive the engine with it); ``policy/`` knows no records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from collective.records import Turn, TurnFinder
from policy import tokenizer
from policy.base import Policy, PolicyRequest, PolicyResponse


class RecordedPolicy:
    def __init__(
        self, turns: Iterable[Turn], *, live: Policy | None = None, until: float = math.inf
    ) -> None:
        self.turns = TurnFinder(turns)
        self.live = live
        self.until = until
        self.name = "recorded" if live is None else f"recorded until {until:g}, then {live.name}"
        self.version = 0
        self.missing = 0  # requests the record had no answer for (a diverging replay)

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        out: list[PolicyResponse | None] = []
        live_at: list[int] = []
        for r in requests:
            if r.asked >= self.until and self.live is not None:
                live_at.append(len(out))
                out.append(None)
                continue
            turn = self.turns.pop((r.agent, r.turn))
            if turn is None:
                # The replay asked something the original never did: it has diverged already.
                # Answer with an empty action so the run completes and the diff can name where.
                self.missing += 1
                out.append(
                    PolicyResponse(
                        text="",
                        token_ids=[tokenizer.EOS],
                        logprobs=[0.0],
                        prompt_tokens=tokenizer.count(r.prompt),
                        version=-1,
                    )
                )
            else:
                out.append(
                    PolicyResponse(
                        text=turn.text,
                        token_ids=list(turn.token_ids),
                        logprobs=list(turn.logprobs),
                        prompt_tokens=turn.prompt_tokens,
                        version=turn.version,
                    )
                )
        if live_at:
            assert self.live is not None
            answers = await self.live.generate([requests[i] for i in live_at])
            for i, a in zip(live_at, answers, strict=True):
                out[i] = a
        return out  # type: ignore[return-value]

    async def aclose(self) -> None:
        if self.live is not None:
            await self.live.aclose()

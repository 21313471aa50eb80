"""A policy that says how far its episodes have got: before each batch, ``on_time`` is told the
latest simulated time a request of the batch was asked at. A command's progress bar reads it
(``collective.base.progress``) without the engine knowing of bars."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from policy.base import Policy, PolicyRequest, PolicyResponse


class Watched:
    def __init__(self, inner: Policy, on_time: Callable[[float], None]) -> None:
        self.inner = inner
        self.on_time = on_time

    @property
    def name(self) -> str:  # the wrapped one's, as it is now
        return self.inner.name

    @name.setter
    def name(self, value: str) -> None:
        self.inner.name = value

    @property
    def version(self) -> int:
        return self.inner.version

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        if requests:
            self.on_time(max(r.asked for r in requests))
        return await self.inner.generate(requests)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __getattr__(self, name: str) -> Any:  # what else the wrapped policy declares
        return getattr(self.inner, name)

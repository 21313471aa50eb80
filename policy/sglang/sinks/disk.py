"""Weights by disk: every server loads the ``save_pretrained`` directory the learner wrote
(``POST /update_weights_from_disk``; io_struct.py, UpdateWeightFromDiskReqInput). It works
wherever the servers can read the learner's directory, and it is where the in-memory sinks fall
back to (:mod:`policy.sglang.sync`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import httpx

from policy.base import PolicyError
from policy.sglang.calls import Calls, excerpt
from policy.sglang.sinks import NewWeights

OnAll = Callable[
    [Sequence[str], Callable[[str], Awaitable[None]]],
    Awaitable[tuple[list[str], dict[str, Exception]]],
]


class DiskSink:
    """Each server loads the directory by a retried call of its own; one that refuses is named
    with the server's message, one that cannot be reached is the fleet's to lose (``on_all``:
    :meth:`policy.sglang.client.SGLangPolicy.on_all`)."""

    method = "disk"

    def __init__(self, calls: Calls, on_all: OnAll) -> None:
        self.calls = calls
        self.on_all = on_all

    async def load(
        self,
        client: httpx.AsyncClient,
        urls: list[str],
        weights: NewWeights,
        label: str,
        what: str,
    ) -> tuple[list[str], dict[str, Exception]]:
        directory = weights.directory()

        async def load(url: str) -> None:
            body = {"model_path": directory, "abort_all_requests": False, "weight_version": label}
            reply = await self.calls.call(
                client, url, "/update_weights_from_disk", body, what, refusal=True
            )
            if not (isinstance(reply, dict) and reply.get("success") is True):
                message = reply.get("message") if isinstance(reply, dict) else reply
                raise PolicyError(
                    f"SGLang server {url} refused to load {what} from {directory!r}: "
                    f"{excerpt(message, 300)}"
                )

        return await self.on_all(urls, load)

    def close(self) -> None:
        return None

"""Which :class:`~policy.sglang.sinks.WeightSink` carries each weight update of a fleet, and the
gate that keeps updates and batches apart.

``weights=`` (the spec's option) picks the sink: ``disk``, ``tensor``, ``distributed``, or
``auto``, which sends tensors on a GPU to servers all on this machine by ``tensor`` and anything
else by ``distributed``. A server running ``dp_size > 1`` is not put in a weight-update group (one
data-parallel rank each would be needed), so such a fleet goes by disk. An in-memory sink that
cannot work (:class:`~policy.sglang.sinks.SinkFailed`) is one warning line naming the server and
the cause, and that update, and every later one, goes by disk: a learner's weights always reach
the servers if the disk can carry them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import structlog
import trio

from policy.base import PolicyError
from policy.sglang.calls import Calls, is_local
from policy.sglang.sinks import NewWeights, SinkFailed, WeightSink
from policy.sglang.sinks.disk import DiskSink, OnAll
from policy.sglang.sinks.distributed import DistributedSink
from policy.sglang.sinks.tensor import TensorSink
from policy.sglang.spec import WeightsMethod

log = structlog.get_logger("policy.sglang.client")


class WeightSync:
    """The sinks of one fleet client and which one the next update takes. ``server_args`` is
    the fleet's record of each server's settings (``tp_size``, ``dp_size``), filled by its
    readiness check; ``on_all`` runs a step on every server, losing those unreachable."""

    def __init__(
        self,
        name: str,
        method: WeightsMethod,
        calls: Calls,
        server_args: dict[str, dict[str, Any]],
        on_all: OnAll,
        *,
        sync_timeout: float,
        bucket_bytes: int,
        group_host: str | None,
    ) -> None:
        self.name = name
        self.method: WeightsMethod = method  # as asked (the spec's weights=)
        self.server_args = server_args
        self.disk = DiskSink(calls, on_all)
        self.memory: dict[str, WeightSink] = {
            "tensor": TensorSink(server_args, bucket_bytes, sync_timeout),
            "distributed": DistributedSink(server_args, bucket_bytes, sync_timeout, group_host),
        }
        self.by_disk_why: str | None = None  # set when a sync fell back to the disk, for good
        self.last_method: str | None = None  # how the last update reached the servers

    @property
    def by_memory(self) -> bool:
        """Whether updates go without the disk (asked, and not fallen back)."""
        return self.method != "disk" and not self.by_disk_why

    def choose(self, urls: list[str], weights: NewWeights) -> WeightSink:
        """The sink of this update (see the module docstring)."""
        if not (urls and weights.has_tensors and self.by_memory):
            return self.disk
        named = weights.named()
        if not named:
            raise PolicyError(f"{self.name}: the learner gave no tensors to send")
        multi = [u for u in urls if int(self.server_args.get(u, {}).get("dp_size") or 1) > 1]
        if multi:
            self.by_disk_why = (
                f"SGLang server {multi[0]} runs dp_size > 1, which this client does not put in "
                "a weight-update group"
            )
            log.warning(self.by_disk_why + "; weights go by disk", policy=self.name)
            return self.disk
        if self.method != "auto":
            return self.memory[self.method]
        on_gpu = getattr(named[0][1], "is_cuda", False)
        local = all(is_local(u) for u in urls)
        return self.memory["tensor" if on_gpu and local else "distributed"]

    async def load(
        self,
        client: httpx.AsyncClient,
        urls: list[str],
        weights: NewWeights,
        label: str,
        what: str,
    ) -> tuple[list[str], dict[str, Exception]]:
        """Put the weights on the paused servers ``urls``, in memory when it can work, else from
        the disk: the servers that loaded them and the errors of those that did not."""
        sink = self.choose(urls, weights)
        if sink is not self.disk:
            try:
                loaded = await sink.load(client, urls, weights, label, what)
                self.last_method = sink.method
                return loaded
            except SinkFailed as e:
                self.close()
                self.by_disk_why = str(e)
                log.warning(
                    f"{e}; weights go to the servers by disk (update_weights_from_disk) from now "
                    "on",
                    policy=self.name,
                )
        self.last_method = self.disk.method
        return await self.disk.load(client, urls, weights, label, what)

    def close(self) -> None:
        for sink in self.memory.values():
            sink.close()


class Gate:
    """Batches run side by side; a weight update runs alone. An update waits for the batches in
    flight and holds back new ones (it is not starved by a stream of them), so every token of a
    batch was sampled by the weights whose version the batch reports."""

    def __init__(self) -> None:
        self._batches = 0
        self._updating = False
        self._updates_waiting = 0
        self._changed = trio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @contextlib.asynccontextmanager
    async def batch(self) -> AsyncIterator[None]:
        while self._updating or self._updates_waiting:
            await self._changed.wait()
        self._batches += 1
        try:
            yield
        finally:
            self._batches -= 1
            self._notify()

    @contextlib.asynccontextmanager
    async def update(self) -> AsyncIterator[None]:
        self._updates_waiting += 1
        try:
            while self._updating or self._batches:
                await self._changed.wait()
        finally:
            self._updates_waiting -= 1
        self._updating = True
        try:
            yield
        finally:
            self._updating = False
            self._notify()

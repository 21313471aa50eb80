"""Weights by broadcast: the learner and every server rank form a torch.distributed group once
(``POST /init_weights_update_group`` ``{"master_address", "master_port", "rank_offset",
"world_size", "group_name", "backend"}``; io_struct.py, InitWeightsUpdateGroupReqInput), the
learner rank 0 hosting the rendezvous and each server's ranks following the ranks of the servers
before it (``tp_size`` of them); NCCL for GPU tensors, gloo for CPU ones. Then per bucket
``POST /update_weights_from_distributed`` ``{"names", "dtypes", "shapes", "group_name",
"load_format": "flattened_bucket", "flush_cache", "abort_all_requests", "weight_version"}``
(UpdateWeightsFromDistributedReqInput) while the learner broadcasts the bucket's bytes
(:mod:`policy.sglang.weights` has the layout and the learner's side of the group)."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio

from policy.sglang.calls import concurrently, excerpt, is_local
from policy.sglang.server import free_port
from policy.sglang.sinks import NamedTensors, NewWeights, SinkFailed, bucket_control, once


class DistributedSink:
    """The group is formed on the first update and kept while the same servers are in it;
    ``group_host`` is the address the servers reach this process at (default: loopback when
    every server is local, else this host's name resolved). Forming the group and each bucket
    are bounded by ``sync_timeout``."""

    method = "distributed"

    def __init__(
        self,
        server_args: dict[str, dict[str, Any]],
        bucket_bytes: int,
        sync_timeout: float,
        group_host: str | None,
    ) -> None:
        self.server_args = server_args  # the fleet's readiness check fills it (tp_size)
        self.bucket_bytes = bucket_bytes
        self.sync_timeout = sync_timeout
        self.group_host = group_host
        self._group: Any = None  # the learner's UpdateGroup, once formed
        self._members: tuple[str, ...] = ()  # the servers in it, in rank order
        self._groups = 0  # groups formed so far (each gets a new name)

    async def load(
        self,
        client: httpx.AsyncClient,
        urls: list[str],
        weights: NewWeights,
        label: str,
        what: str,
    ) -> tuple[list[str], dict[str, Exception]]:
        """One ``/update_weights_from_distributed`` call per bucket on every server, with
        ``load_format: "flattened_bucket"``, while this process broadcasts the bucket's bytes
        over the group (rank 0)."""
        from policy.sglang.weights import buckets, dtype_name, flatten

        named = weights.named()
        if self._group is None or self._members != tuple(urls):
            self.close()
            await self._form_group(client, urls, named)
        group = self._group
        parts = buckets(named, self.bucket_bytes)
        for k, bucket in enumerate(parts):
            last = k == len(parts) - 1
            body = {
                "names": [n for n, _ in bucket],
                "dtypes": [dtype_name(t) for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "group_name": group.group_name,
                "load_format": "flattened_bucket",
                **bucket_control(last, label),
            }
            which = f"bucket {k + 1}/{len(parts)}"
            await self._bucket(client, urls, group, flatten(bucket), body, which)
        return list(urls), {}

    async def _bucket(
        self,
        client: httpx.AsyncClient,
        urls: list[str],
        group: Any,
        flat: Any,
        body: dict[str, Any],
        which: str,
    ) -> None:
        """One bucket: every server's call and the learner's broadcast, within ``sync_timeout``."""
        waiting = {*urls, "the learner's broadcast"}
        what = f"{which} of version {body['weight_version'] or '(label on the last bucket)'}"

        async def post(url: str) -> None:
            path = "/update_weights_from_distributed"
            await once(client, url, path, body, what, self.sync_timeout)
            waiting.discard(url)

        async def broadcast() -> None:
            try:
                await trio.to_thread.run_sync(group.broadcast, flat, abandon_on_cancel=True)
            except RuntimeError as e:
                raise SinkFailed(
                    f"the broadcast of {which} to {', '.join(urls)} failed: {excerpt(e, 200)}"
                ) from e
            waiting.discard("the learner's broadcast")

        jobs: list[Callable[[], Awaitable[None]]] = [functools.partial(post, u) for u in urls]
        with trio.move_on_after(self.sync_timeout) as scope:
            await concurrently([*jobs, broadcast])
        if scope.cancelled_caught:
            raise SinkFailed(
                f"SGLang server(s) {', '.join(sorted(waiting))} did not finish {which} within "
                f"sync_timeout={self.sync_timeout:g}s (a hung collective)"
            )

    async def _form_group(
        self, client: httpx.AsyncClient, urls: list[str], named: NamedTensors
    ) -> None:
        """``/init_weights_update_group`` on every server at once while this process joins as
        rank 0: each server's ranks follow the ranks of the servers before it (its ``tp_size``
        each)."""
        from policy.sglang.weights import UpdateGroup

        ranks = [int(self.server_args.get(u, {}).get("tp_size") or 1) for u in urls]
        world = 1 + sum(ranks)
        local = all(is_local(u) for u in urls)
        host = self.group_host or ("127.0.0.1" if local else socket.gethostbyname(socket.getfqdn()))
        backend = "nccl" if getattr(named[0][1], "is_cuda", False) else "gloo"
        self._groups += 1
        name = f"collective-weights-{os.getpid()}-{self._groups}"
        port = free_port()
        try:
            group = UpdateGroup(host, port, world, name, backend, self.sync_timeout)
        except (OSError, RuntimeError) as e:  # e.g. the port was taken meanwhile
            raise SinkFailed(
                f"the learner cannot host weight-update group {name} at {host}:{port}: "
                f"{excerpt(e, 200)}"
            ) from e
        offsets = [1 + sum(ranks[:i]) for i in range(len(urls))]
        waiting = {*urls, "the learner"}

        async def init(url: str, offset: int) -> None:
            body = {
                "master_address": host,
                "master_port": port,
                "rank_offset": offset,
                "world_size": world,
                "group_name": name,
                "backend": backend,
            }
            path = "/init_weights_update_group"
            await once(client, url, path, body, f"group {name}", self.sync_timeout)
            waiting.discard(url)

        async def join() -> None:
            try:
                await trio.to_thread.run_sync(group.join, abandon_on_cancel=True)
            except RuntimeError as e:
                raise SinkFailed(
                    f"weight-update group {name} ({world} ranks) did not form: {excerpt(e, 200)}"
                ) from e
            waiting.discard("the learner")

        jobs: list[Callable[[], Awaitable[None]]] = [
            functools.partial(init, u, o) for u, o in zip(urls, offsets, strict=True)
        ]
        try:
            with trio.move_on_after(self.sync_timeout) as scope:
                await concurrently([*jobs, join])
        except BaseException:
            group.close()
            raise
        if scope.cancelled_caught:
            group.close()
            raise SinkFailed(
                f"weight-update group {name} ({world} ranks at {host}:{port}) did not form "
                f"within sync_timeout={self.sync_timeout:g}s; waiting on "
                + ", ".join(sorted(waiting))
            )
        self._group, self._members = group, tuple(urls)

    def close(self) -> None:
        """Drop the learner's side of the group (the servers' side is left to their timeout)."""
        if self._group is not None:
            self._group.close()
        self._group, self._members = None, ()

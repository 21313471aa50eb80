"""Weights by shared memory: ``POST /update_weights_from_tensor`` (io_struct.py,
UpdateWeightsFromTensorReqInput: ``serialized_named_tensors`` one entry per TP rank,
``load_format``, ``flush_cache``, ``abort_all_requests``, ``weight_version``), bucket by bucket.
Each entry pickles the tensors with torch's multiprocessing reductions
(:func:`policy.sglang.weights.serialize_named_tensors`): GPU tensors travel as CUDA IPC handles,
so the servers must run on this machine and the tensors be on a GPU (CPU tensors would travel as
file descriptors, which an unrelated process cannot open)."""

from __future__ import annotations

import functools
from typing import Any

import httpx
import trio

from policy.sglang.calls import concurrently
from policy.sglang.sinks import NewWeights, SinkFailed, bucket_control, once


class TensorSink:
    """Every server takes each bucket at once; the label goes with the last bucket, so a server
    reports it only once it holds every tensor. Each call is bounded by ``sync_timeout``."""

    method = "tensor"

    def __init__(
        self, server_args: dict[str, dict[str, Any]], bucket_bytes: int, sync_timeout: float
    ) -> None:
        self.server_args = server_args  # the fleet's readiness check fills it (tp_size)
        self.bucket_bytes = bucket_bytes
        self.sync_timeout = sync_timeout

    async def load(
        self,
        client: httpx.AsyncClient,
        urls: list[str],
        weights: NewWeights,
        label: str,
        what: str,
    ) -> tuple[list[str], dict[str, Exception]]:
        from policy.sglang.weights import buckets, serialize_named_tensors

        parts = buckets(weights.named(), self.bucket_bytes)
        for k, bucket in enumerate(parts):
            last = k == len(parts) - 1
            entry = await trio.to_thread.run_sync(serialize_named_tensors, bucket)

            async def send(url: str, entry: str = entry, last: bool = last) -> None:
                tp = int(self.server_args.get(url, {}).get("tp_size") or 1)
                body = {
                    "serialized_named_tensors": [entry] * tp,
                    "load_format": None,
                    **bucket_control(last, label),
                }
                path = "/update_weights_from_tensor"
                with trio.move_on_after(self.sync_timeout) as scope:
                    await once(client, url, path, body, what, self.sync_timeout)
                if scope.cancelled_caught:
                    raise SinkFailed(
                        f"SGLang server {url}: {path} for {what} gave no answer within "
                        f"sync_timeout={self.sync_timeout:g}s"
                    )

            await concurrently([functools.partial(send, url) for url in urls])
        return list(urls), {}

    def close(self) -> None:
        return None

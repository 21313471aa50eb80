"""How a learner's new weights reach paused SGLang servers: the :class:`WeightSink` protocol and
what its implementations share. One module per way the weights travel
(docs/advanced_features/sglang_for_rl.md in sgl-project/sglang; io_struct.py for every field):

- :mod:`.disk`: ``POST /update_weights_from_disk`` ``{"model_path", "abort_all_requests",
  "weight_version"}``, answering ``{"success", "message", "num_paused_requests"}`` (HTTP 400
  when it failed): the servers read a ``save_pretrained`` directory the learner wrote;
- :mod:`.distributed`: ``POST /init_weights_update_group`` once, then one
  ``POST /update_weights_from_distributed`` a bucket while the learner broadcasts the bucket's
  bytes over a torch.distributed group (:mod:`policy.sglang.weights` has the layout);
- :mod:`.tensor`: ``POST /update_weights_from_tensor``: the tensors' memory shared with servers on
  this machine (CUDA IPC).

In memory (distributed, tensor), the version label rides on the last call only, so a server
reports it once it holds every tensor; ``abort_all_requests`` is false (the fleet's pause already
aborted what ran). Those calls are never retried (half a collective cannot be sent twice) and each
step (forming the group, one bucket) is bounded by ``sync_timeout``; a refusal, a group that
cannot form or a step past its bound is :class:`SinkFailed`, one line naming the server and the
cause, and :class:`policy.sglang.sync.WeightSync` sends that update, and every later one, by disk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

from policy.sglang.calls import excerpt

NamedTensors = Sequence[tuple[str, Any]]  # (name, torch.Tensor) as the checkpoint names them


class SinkFailed(Exception):
    """An in-memory weight transfer that cannot work; the message is one line naming the server
    (or the learner) and the cause, and the update goes by disk."""


class NewWeights:
    """One version's weights as the learner offers them, each form made only when a sink asks
    for it (and once): ``path`` is a ``save_pretrained`` directory the servers can read, or a
    function that writes one and returns it; ``tensors``, when given, returns the weights as
    ``(name, tensor)`` pairs named as the checkpoint names them."""

    def __init__(
        self,
        path: str | Path | Callable[[], str | Path],
        tensors: Callable[[], NamedTensors] | None = None,
    ) -> None:
        self._path = path
        self._tensors = tensors
        self._directory: str | None = None
        self._named: list[tuple[str, Any]] | None = None

    @property
    def has_tensors(self) -> bool:
        return self._tensors is not None

    def directory(self) -> str:
        if self._directory is None:
            self._directory = str(self._path() if callable(self._path) else self._path)
        return self._directory

    def named(self) -> list[tuple[str, Any]]:
        if self._named is None:
            if self._tensors is None:
                raise ValueError("these weights were offered as a directory only")
            self._named = list(self._tensors())
        return self._named


class WeightSink(Protocol):
    """One way new weights reach servers that are paused (the fleet pauses them, checks the
    label they then report and resumes them: :meth:`policy.sglang.client.SGLangPolicy.
    update_weights`)."""

    method: str  # "disk", "tensor" or "distributed": how the weights travel

    async def load(
        self,
        client: httpx.AsyncClient,
        urls: list[str],
        weights: NewWeights,
        label: str,
        what: str,
    ) -> tuple[list[str], dict[str, Exception]]:
        """Put ``weights`` on the servers ``urls``, labelled ``label``: the servers that hold
        them, and the errors of those that do not. An in-memory sink does all or nothing and
        raises :class:`SinkFailed` when it cannot."""
        ...

    def close(self) -> None:
        """Let go of what the sink holds between updates (a weight-update group)."""
        ...


def bucket_control(last: bool, label: str) -> dict[str, Any]:
    """The control fields of one in-memory bucket: requests are never aborted (explicitly), and
    only the last bucket flushes the cache and carries the version label, so a server reports
    the label once it holds every tensor."""
    return {
        "flush_cache": last,
        "abort_all_requests": False,
        "weight_version": label if last else None,
    }


async def once(
    client: httpx.AsyncClient,
    url: str,
    path: str,
    body: dict[str, Any],
    what: str,
    timeout: float,
) -> None:
    """One control call of an in-memory update, not retried (the server's half of a collective
    cannot be sent twice): :class:`SinkFailed` naming the server and the cause when it is not
    answered ``{"success": true}``."""
    try:
        r = await client.post(url + path, json=body, timeout=timeout)
    except (httpx.TimeoutException, httpx.TransportError) as e:
        raise SinkFailed(f"SGLang server {url}: {path} for {what}: {type(e).__name__}") from e
    try:
        reply = r.json()
    except ValueError:
        reply = {"message": r.text}
    if r.status_code != 200 or not (isinstance(reply, dict) and reply.get("success") is True):
        message = reply.get("message") if isinstance(reply, dict) else reply
        raise SinkFailed(
            f"SGLang server {url} refused {path} for {what} (HTTP {r.status_code}): "
            f"{excerpt(message, 300)}"
        )

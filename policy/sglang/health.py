"""Whether a fleet's servers can serve it: healthy, and honouring the seeds the client sends.

``GET /health`` answers 503 while a server starts and 200 once it serves; a server still
starting is waited out for up to ``wait`` seconds, one that cannot be reached at all is
:class:`PolicyUnavailable` (the spec points nowhere). ``sampling_seed`` is read only by a server
started with ``--enable-deterministic-inference`` (python/sglang/srt/sampling/
sampling_batch_info.py builds the seed tensor only then, and fills seed 42 for a request without
one); any other server accepts the key and samples as if it were absent. So each server's
settings are read (``GET /server_info``, ``/get_server_info`` before it was renamed: ServerArgs
as a dict plus ``version``) and a seeded client refuses a server that does not report
``enable_deterministic_inference: true`` on sglang >= 0.5.3, the first release whose sampling
parameters have ``sampling_seed``. ``seeds=off`` sends none, and says so in a warning: a replay
then samples other tokens. The settings read are kept (:attr:`Health.server_args`): the weight
sinks read each server's ``tp_size`` and ``dp_size`` there.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import httpx
import structlog
import trio

from policy.base import PolicyError, PolicyUnavailable
from policy.sglang.calls import Calls, Unreachable, concurrently, excerpt
from policy.sglang.server import HEALTH_POLL

log = structlog.get_logger("policy.sglang.client")

MIN_SGLANG = (0, 5, 3)  # the first release with sampling_seed


def version_tuple(text: Any) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", str(text)) if text is not None else None
    return tuple(int(g) for g in match.groups()) if match else None


class Health:
    """The readiness check of one fleet client, done once (:meth:`ensure`), and what it read of
    each server's settings."""

    def __init__(self, calls: Calls, name: str, *, seeded: bool, wait: float) -> None:
        self.calls = calls
        self.name = name
        self.seeded = seeded
        self.wait = wait
        self.server_args: dict[str, dict[str, Any]] = {}  # /server_info, by server
        self._ready = False
        self._lock = trio.Lock()

    async def ensure(self, client: httpx.AsyncClient, urls: Sequence[str]) -> None:
        """Once: every server healthy (503 while it starts is waited out) and, when seeds are
        sent, every server one that honours them."""
        async with self._lock:
            if self._ready:
                return
            await concurrently([functools.partial(self._check, client, u) for u in urls])
            if not self.seeded:
                log.warning(
                    "seeds are off: each SGLang request is sampled without its seed, so a "
                    "replay of this run will not sample the same tokens",
                    policy=self.name,
                )
            self._ready = True

    async def _check(self, client: httpx.AsyncClient, url: str) -> None:
        await self._wait_healthy(client, url)
        info, path = await self.calls.first_of(
            client, url, ("/server_info", "/get_server_info"), "the server's settings"
        )
        self.server_args[url] = info
        deterministic = info.get("enable_deterministic_inference")
        release = version_tuple(info.get("version"))
        if not self.seeded:
            if deterministic is True:
                log.warning(
                    "this server runs deterministic inference and gets no seeds: it samples "
                    "every request with seed 42, so equal prompts get equal answers",
                    server=url,
                )
            return
        if release is not None and release < MIN_SGLANG:
            raise PolicyError(
                f"SGLang server {url} runs sglang {info.get('version')}; per-request seeds "
                "(sampling_seed) need sglang >= 0.5.3 (or give the spec seeds=off)"
            )
        if deterministic is not True:
            said = (
                f"its {path} says enable_deterministic_inference={deterministic!r}"
                if "enable_deterministic_inference" in info
                else f"its {path} does not mention enable_deterministic_inference"
            )
            raise PolicyError(
                f"SGLang server {url} does not run with --enable-deterministic-inference ({said}),"
                " so it would ignore each request's sampling_seed and a replay would sample "
                "other tokens; restart it with that flag, or give the spec seeds=off"
            )

    async def _wait_healthy(self, client: httpx.AsyncClient, url: str) -> None:
        deadline = trio.current_time() + self.wait
        unreachable = 0
        while True:
            try:
                r = await self.calls.request(client, url, "/health", None)
            except Unreachable as e:
                unreachable += 1
                if unreachable >= self.calls.attempts:
                    raise PolicyUnavailable(
                        f"SGLang server {url} cannot be reached ({e}); is it running there?"
                    ) from None
                why = str(e)
            else:
                if r.status_code == 200:
                    return
                if r.status_code != 503:
                    raise PolicyError(
                        f"SGLang server {url}: /health answered HTTP {r.status_code}: "
                        f"{excerpt(r.text, 200)}"
                    )
                why = "HTTP 503, still starting"
            if trio.current_time() >= deadline:
                raise PolicyError(
                    f"SGLang server {url} was not ready after {self.wait:g}s (last: {why}); a "
                    "large model takes minutes to load: give the spec a longer wait=SECONDS"
                )
            await trio.sleep(HEALTH_POLL)

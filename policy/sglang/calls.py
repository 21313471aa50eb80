"""HTTP calls to one SGLang server: bounded retries, the errors they end in, and the helpers the
fleet (:mod:`policy.sglang.client`), the readiness checks (:mod:`policy.sglang.health`) and the
weight sinks (:mod:`policy.sglang.sinks`) share.

A call that fails with a connection refused or dropped, a timeout, HTTP 429 or 5xx is retried
with exponential backoff, ``attempts`` times in all; a server still unreachable after that is
:class:`Lost` (the fleet moves its share to the others). Any other error status and any answer
that is not JSON raise :class:`PolicyError` naming the server, the endpoint and what was asked.
``--api-key`` servers want ``Authorization: Bearer KEY`` on everything but /health
(python/sglang/srt/utils, add_api_key_middleware).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import httpx
import trio

from policy.base import PolicyError, PolicyRequest, PolicyUnavailable

# The most one light GET (/health, /server_info, /model_info) may take: SGLang's /health answers
# within SGLANG_HEALTH_CHECK_TIMEOUT (20 s by default) plus its 1 s poll, the others at once.
QUICK_TIMEOUT = 30.0
T = TypeVar("T")


class Unreachable(Exception):
    """No HTTP answer: refused, dropped, timed out (the message says which)."""


class Lost(PolicyUnavailable):
    """A server that stayed unreachable through every retry."""


def who(requests: Sequence[PolicyRequest]) -> str:
    shown = ", ".join(f"agent {r.agent} turn {r.turn}" for r in requests[:3])
    more = f" and {len(requests) - 3} more" if len(requests) > 3 else ""
    return f"{len(requests)} request(s): {shown}{more}"


def excerpt(text: Any, limit: int) -> str:
    """The start of a server's answer on one line (errors are one line)."""
    return " ".join(str(text).split())[:limit]


def is_local(url: str) -> bool:
    host = httpx.URL(url).host
    return host in ("127.0.0.1", "localhost", "::1") or host == socket.gethostname()


async def concurrently(jobs: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run the jobs at once; their results in order. The first job to fail cancels the rest and
    its exception is raised as itself (not wrapped in an exception group)."""
    results: list[Any] = [None] * len(jobs)
    failures: dict[int, Exception] = {}

    async def run(k: int, job: Callable[[], Awaitable[T]], scope: trio.CancelScope) -> None:
        try:
            results[k] = await job()
        except Exception as e:
            failures[k] = e
            scope.cancel()

    async with trio.open_nursery() as nursery:
        for k, job in enumerate(jobs):
            nursery.start_soon(run, k, job, nursery.cancel_scope)
    if failures:
        raise failures[min(failures)]
    return results


class Calls:
    """How this program calls a server: ``timeout`` bounds one attempt at one call (a light GET:
    at most :data:`QUICK_TIMEOUT`), ``attempts`` the tries of one call, ``backoff`` is the first
    pause between them (doubling after each); ``api_key`` is sent as ``Authorization: Bearer``."""

    def __init__(
        self, *, timeout: float, attempts: int, backoff: float, api_key: str | None
    ) -> None:
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.api_key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._tls: ssl.SSLContext | None = None  # made on first use (client)

    def client(self) -> httpx.AsyncClient:
        # A client per call: a connection pool belongs to one event loop, and a policy outlives
        # many trio.run calls (one per episode batch or fork). One TCP connect per server per GPU
        # batch is nothing next to the batch.
        # The TLS context is made once: httpx would otherwise build a default one for every
        # client, loading the system's CA certificates each time (its CPU cost a batch:
        # bench/results/sglang_client/README.md).
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout, connect=min(10.0, self.timeout)),
            headers=self.headers,
            verify=self._tls,
        )

    async def request(
        self, client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any] | None
    ) -> httpx.Response:
        """One attempt: a GET when ``body`` is None, else a POST of it as JSON."""
        limit = self.timeout if body is not None else min(self.timeout, QUICK_TIMEOUT)
        try:
            if body is None:
                timeout = httpx.Timeout(limit, connect=min(10.0, limit))
                return await client.get(url + path, timeout=timeout)
            return await client.post(url + path, json=body)
        except httpx.TimeoutException as e:
            raise Unreachable(f"timed out after {limit:g}s ({type(e).__name__})") from e
        except httpx.TransportError as e:  # refused, reset, dropped mid-answer
            raise Unreachable(f"{type(e).__name__}: {e}") from e

    async def call(
        self,
        client: httpx.AsyncClient,
        url: str,
        path: str,
        body: dict[str, Any] | None,
        what: str,
        *,
        missing_ok: bool = False,
        refusal: bool = False,
    ) -> Any:
        """One call with bounded retries of transient failures; the decoded JSON answer. None for
        a 404 when ``missing_ok``; the JSON of an HTTP 400 when ``refusal`` (the caller reads
        why). :class:`Lost` when the server stayed unreachable."""
        last, unreachable = "", False
        for attempt in range(self.attempts):
            if attempt:
                await trio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                r = await self.request(client, url, path, body)
            except Unreachable as e:
                last, unreachable = str(e), True
                continue
            if r.status_code == 429 or r.status_code >= 500:
                last, unreachable = f"HTTP {r.status_code}: {excerpt(r.text, 300)}", False
                continue
            if r.status_code == 404 and missing_ok:
                return None
            if r.status_code >= 400 and not (refusal and r.status_code == 400):
                hint = " (wrong or missing API key?)" if r.status_code == 401 else ""
                raise PolicyError(
                    f"SGLang server {url}: {path} for {what} was refused with HTTP "
                    f"{r.status_code}{hint}: {excerpt(r.text, 500)}"
                )
            try:
                return r.json()
            except ValueError:
                raise PolicyError(
                    f"SGLang server {url}: {path} for {what} answered something that is not "
                    f"JSON: {r.text[:200]!r}"
                ) from None
        failure = Lost if unreachable else PolicyError
        raise failure(
            f"SGLang server {url}: {path} for {what} failed {self.attempts} times (last: {last})"
        )

    async def first_of(
        self, client: httpx.AsyncClient, url: str, paths: Sequence[str], what: str
    ) -> tuple[dict[str, Any], str]:
        """The first of ``paths`` the server has (newer SGLang renamed /get_X to /X and keeps the
        old name as an alias; older servers answer 404 to the new one)."""
        for path in paths:
            got = await self.call(client, url, path, None, what, missing_ok=True)
            if got is None:
                continue
            if not isinstance(got, dict):
                raise PolicyError(f"SGLang server {url}: {path} answered {str(got)[:200]!r}")
            return got, path
        raise PolicyError(f"SGLang server {url} answers none of {', '.join(paths)} ({what})")

    async def model_info(self, client: httpx.AsyncClient, url: str, what: str) -> dict[str, Any]:
        """``GET /model_info`` (``/get_model_info`` before the rename)."""
        info, _ = await self.first_of(client, url, ("/model_info", "/get_model_info"), what)
        return info

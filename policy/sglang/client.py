"""The SGLang backend: one policy served by a fleet of SGLang servers over their native HTTP API.

Written against sglang 0.5.3 and later: 0.5.3 is the first release whose sampling parameters
have ``sampling_seed``, so every seeded request fails on 0.5.1 and 0.5.2. Every request and
response shape below is SGLang's own; where each comes from is cited next to the code that uses
it (paths are in sgl-project/sglang):

- ``POST /generate``, its sampling parameters and its answers, aborted ones included:
  :mod:`policy.sglang.shapes`; which servers honour ``sampling_seed``: :mod:`policy.sglang.health`.
- Weight sync (docs/advanced_features/sglang_for_rl.md): ``POST /pause_generation``
  ``{"mode": "abort"}`` (the default mode; servers before the modes existed ignore the body),
  then the load by one :class:`~policy.sglang.sinks.WeightSink` (disk, tensor or distributed:
  :mod:`policy.sglang.sync` picks it), then ``GET /model_info`` (``/get_model_info`` before the
  rename) must report the ``weight_version`` just sent, on every server, before ``POST
  /continue_generation`` ``{}``.
- How one call is made, retried and given up on: :mod:`policy.sglang.calls`. A server this
  program starts itself (``sglang:launch:``) is :mod:`policy.sglang.server`.

**The fleet.** Each batch is ordered by its prompts' token ids (:func:`by_head`) and split into
contiguous, near-equal shares, one per live server, sent at once. Sorted order is the depth-first
order of the prompts' trie, the structure SGLang's radix cache keeps, so prompts that share a head
(one action space's header and tool list, then whatever else they share) sit side by side and
each contiguous share is a run of neighbouring subtrees: a server prefills a shared head once,
while the shares stay within one request of each other in size. It matters where heads differ
and arrive interleaved (several roles' spaces, a shared transcript at the prompt's head); the
workshop's prompts share the header and tool list and little else, and the conductor asks
episode by episode, so there arrival order does nearly as well (the cache shares measured on a
workshop batch: bench/results/sglang_client/README.md; ``tests/policy/test_sglang.py`` measures
both). The order is a function of the prompts alone, so it is deterministic, and a request is
seeded and batch-independent, so which server answers it cannot change the answer (on servers of
the same build, GPU type and flags). :attr:`SGLangPolicy.cached_tokens` sums the
``cached_tokens`` the servers report.

A server still unreachable after its call's retries is *lost*: its share goes to the others, a
structlog warning says so, and :attr:`SGLangPolicy.lost_servers` and
:attr:`SGLangPolicy.requests_moved` count it. The run goes on while one server is left (the last
one lost is no warning: it is the :class:`PolicyError` that follows). Any other error status and
any answer that is not the documented shape raise :class:`PolicyError` naming the server and the
request (agent, turn): never a silently wrong answer.

**Time.** Three bounds, so that a server that accepts connections and never answers cannot hold a
run for longer than the user chose. ``timeout`` bounds one attempt at one call (default 120 s: a
``/generate`` share answers in seconds to a minute, its length bounded by ``max_new_tokens``);
the light GETs (``/health``, ``/server_info``, ``/model_info``) get at most
:data:`policy.sglang.calls.QUICK_TIMEOUT`, because SGLang answers ``/health`` within its own
``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s by default; python/sglang/srt/entrypoints/http_server.py,
health_generate) and the info endpoints at once. ``deadline`` bounds one batch in total, every
server, attempt, backoff and resend included (default 600 s); past it the batch fails naming the
servers that had not answered. It exceeds ``attempts`` x ``timeout`` (480 s), so a fleet server
silent through all its attempts is lost, and its share moved, before the deadline ends the batch.
``wait`` bounds a server still starting (503) and a follower waiting for a version.

**Followers.** A client that calls :meth:`SGLangPolicy.follow` loads no weights: another client
(the learner's, in another process) does, and the follower samples only from the version it is
told to follow, waiting for the fleet to reach it (a Ray rollout worker: ``collective.rl.cluster``).

**The spec** (``sglang:URL[,URL...]`` or ``sglang:launch:MODEL_DIR``, with options) is read by
:mod:`policy.sglang.spec`; :func:`policy_from_spec` builds the policy it names.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import structlog
import trio

from policy.base import PolicyError, PolicyRequest, PolicyResponse, PolicyUnavailable
from policy.hf.prompt import load_tokenizer, prompt_ids
from policy.sglang.calls import Calls, Lost, concurrently, who
from policy.sglang.health import MIN_SGLANG, Health
from policy.sglang.server import HEALTH_POLL, SGLangServer
from policy.sglang.shapes import Aborted, parse_answer, sampling_params
from policy.sglang.sinks import NamedTensors, NewWeights
from policy.sglang.spec import WEIGHTS_METHODS, Constraint, WeightsMethod, parse_spec
from policy.sglang.sync import Gate, WeightSync

log = structlog.get_logger("policy.sglang.client")

__all__ = ["MIN_SGLANG", "SGLangPolicy", "by_head", "policy_from_spec", "split"]

T = TypeVar("T")


def split(items: Sequence[T], parts: int) -> list[list[T]]:
    """``items`` in ``parts`` contiguous shares whose sizes differ by at most one, in order."""
    size, extra = divmod(len(items), parts)
    shares, start = [], 0
    for p in range(parts):
        end = start + size + (p < extra)
        shares.append(list(items[start:end]))
        start = end
    return shares


def by_head(items: Sequence[int], prompts: Sequence[Sequence[int]]) -> list[int]:
    """``items`` (indices into ``prompts``) in the lexicographic order of their prompts' token
    ids, ties by index: the trie's depth-first order, where shared heads are adjacent."""
    return sorted(items, key=lambda i: (list(prompts[i]), i))


class _Behind(Exception):
    """(A follower.) A server answered with weights other than the version being followed."""


class SGLangPolicy:
    """A :class:`policy.base.Policy` served by the SGLang servers at ``urls`` (see the module
    docstring for how a batch is shared and what happens when a server is lost).

    ``tokenizer`` is the model's Hugging Face tokenizer (a local directory, or a loaded tokenizer);
    by default it is read from the directory the first server reports in ``/model_info``, which
    works when the servers run on this machine. ``constraint`` picks how actions are constrained (a
    regex works with every SGLang grammar backend; EBNF needs XGrammar or llguidance). ``seeded``
    sends each request's seed as ``sampling_seed`` and then requires every server to run with
    ``--enable-deterministic-inference``. ``api_key`` is sent as ``Authorization: Bearer``.
    ``timeout`` bounds one attempt at one HTTP call (a light GET: at most
    :data:`policy.sglang.calls.QUICK_TIMEOUT`); ``attempts`` bounds the tries of one call,
    ``backoff`` is the first pause between them (doubling after each); ``deadline`` bounds one
    :meth:`generate` in all (its sends, retries and resends; not the one-time readiness check);
    ``wait`` bounds how long a server may answer /health with 503 (starting) before the first
    batch. ``weights`` picks how :meth:`update_weights` loads new weights (``disk``,
    ``distributed``, ``tensor`` or ``auto``; :mod:`policy.sglang.sync`), ``sync_timeout`` bounds
    each step of an in-memory load, ``update_deadline`` one :meth:`update_weights` in all (every
    call, retry, bucket and the fallback to the disk: the per-call bounds alone add up to hours
    over a fleet), ``bucket_bytes`` the bytes of one bucket, ``group_host`` the address the
    servers reach this process at for the weight-update group (default: loopback when every
    server is local, else this host's name resolved).

    A server holds one set of weights, so a request pinned to another version
    (``PolicyRequest.version`` other than -1 and :attr:`version`) is refused with
    :class:`PolicyError`. From another thread (a learner), call
    ``trio.from_thread.run(policy.update_weights, ...)``.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        tokenizer: str | Path | Any | None = None,
        constraint: Constraint = "regex",
        version: int = 0,
        seeded: bool = True,
        api_key: str | None = None,
        timeout: float = 120.0,
        attempts: int = 4,
        backoff: float = 0.5,
        wait: float = 900.0,
        deadline: float = 600.0,
        servers: Sequence[SGLangServer] = (),
        name: str | None = None,
        weights: WeightsMethod = "disk",
        sync_timeout: float = 60.0,
        bucket_bytes: int = 512 << 20,
        group_host: str | None = None,
        update_deadline: float = 1800.0,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("an SGLang policy needs at least one server URL")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(
                    f"SGLang server URL must start with http:// or https://, got {url!r}"
                )
        if len(set(urls)) != len(urls):
            raise ValueError(f"an SGLang server is listed twice in {urls}")
        if weights not in WEIGHTS_METHODS:
            raise ValueError(
                f"weights must be one of {', '.join(WEIGHTS_METHODS)}, got {weights!r}"
            )
        if not (
            0 < sync_timeout < math.inf and bucket_bytes > 0 and 0 < update_deadline < math.inf
        ):
            raise ValueError(
                "need finite sync_timeout > 0, bucket_bytes > 0 and finite update_deadline > 0, "
                f"got {sync_timeout}, {bucket_bytes}, {update_deadline}"
            )
        if constraint not in ("regex", "ebnf"):
            raise ValueError(f"constraint must be 'regex' or 'ebnf', got {constraint!r}")
        if not (
            attempts >= 1
            and 0 < timeout < math.inf
            and 0 <= backoff < math.inf
            and 0 < wait < math.inf
            and 0 < deadline < math.inf
        ):
            raise ValueError(
                "need attempts >= 1, finite timeout > 0, backoff >= 0, wait > 0, deadline > 0; "
                f"got {attempts}, {timeout}, {backoff}, {wait}, {deadline}"
            )
        self.urls: tuple[str, ...] = tuple(u.rstrip("/") for u in urls)
        self.name = name or "sglang:" + ",".join(self.urls)
        self.version = version
        self.constraint: Constraint = constraint
        self.seeded = seeded
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.wait = wait
        self.deadline = deadline
        self.update_deadline = update_deadline
        self.servers = tuple(servers)
        self.lost_servers: list[str] = []  # in the order they were lost
        self.requests_moved = 0  # requests sent again to another server after theirs was lost
        self.cached_tokens = 0  # prompt tokens the servers' radix caches served (their report)
        self.calls = Calls(timeout=timeout, attempts=attempts, backoff=backoff, api_key=api_key)
        self.health = Health(self.calls, self.name, seeded=seeded, wait=wait)
        self.sync = WeightSync(
            self.name,
            weights,
            self.calls,
            self.health.server_args,
            self._on_all,
            sync_timeout=sync_timeout,
            bucket_bytes=bucket_bytes,
            group_host=group_host,
        )
        self._lost_why: dict[str, str] = {}
        self._tokenizer_source = tokenizer
        self._tokenizer: Any = None
        self._label: str | None = None  # the weight_version we told the servers, once we have
        self._first_label: tuple[str, str] | None = None  # (server, label) before any update
        self._mixed: str | None = None  # why the fleet may hold mixed weights
        self._gate = Gate()
        self._following = False  # a follower: another client loads the weights (see follow)
        self._label_seen = False  # (a follower) every live server reported _label since follow

    @property
    def weights(self) -> WeightsMethod:
        """How weight updates were asked to travel (the spec's ``weights=``)."""
        return self.sync.method

    @property
    def by_memory(self) -> bool:
        """Whether weight updates go without the disk: asked so, and not fallen back to it."""
        return self.sync.by_memory

    @property
    def weights_by_disk_why(self) -> str | None:
        """Why updates fell back to the disk for good (None while they have not)."""
        return self.sync.by_disk_why

    @property
    def last_sync_method(self) -> str | None:
        """How the last update reached the servers: ``disk``, ``tensor`` or ``distributed``."""
        return self.sync.last_method

    @property
    def live_servers(self) -> list[str]:
        return [u for u in self.urls if u not in self.lost_servers]

    @property
    def label(self) -> str | None:
        """The weight_version this client loaded (or follows); None before any load."""
        return self._label

    def follower_args(self) -> dict[str, Any]:
        """The arguments of a client of the same fleet with the same settings (a rollout worker
        elsewhere builds its own from them: ``SGLangPolicy(**args)``, then :meth:`follow`)."""
        source = self._tokenizer_source
        return {
            "urls": self.live_servers,
            "tokenizer": str(source) if isinstance(source, str | Path) else None,
            "constraint": self.constraint,
            "seeded": self.seeded,
            "api_key": self.calls.api_key or None,
            "timeout": self.timeout,
            "attempts": self.attempts,
            "backoff": self.backoff,
            "wait": self.wait,
            "deadline": self.deadline,
            "name": self.name,
        }

    def follow(self, version: int, label: str | None) -> None:
        """Make this client a follower of the fleet at ``version``: another client (the
        learner's) loads the weights, labelled ``label`` (None: the weights the servers started
        with, which must be the same on every server). Every answer used is one the servers
        sampled with that label, and answers carry ``version``. Before its first batch at a new
        version the follower waits, up to ``wait`` seconds, until every server reports that
        label in ``/model_info``; an answer with another label (a server not yet updated) is
        waited out and sent again the same way; a server reporting a later version than
        ``version`` is an error (the weights this episode is pinned to are gone)."""
        if (version, label) != (self.version, self._label):
            self._label_seen = False
        self._following, self.version, self._label = True, version, label
        self._first_label = None

    # -- the Policy protocol ----------------------------------------------------------------------

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        if not requests:
            return []
        async with self._gate.batch(), self.calls.client() as client:
            if self._mixed:
                raise PolicyError(self._mixed)
            version = self.version
            pinned = [r for r in requests if r.version not in (-1, version)]
            if pinned:  # the servers hold one set of weights: they cannot answer for another
                wanted = sorted({r.version for r in pinned})
                raise PolicyError(
                    f"{self.name} holds policy version {version}, but {who(pinned)} are "
                    f"pinned to version(s) {wanted}"
                )
            params = [self._params(r) for r in requests]
            await self.health.ensure(client, self.live_servers)
            tokenizer = await self._ensure_tokenizer(client)
            prompts = [prompt_ids(tokenizer, r.prompt, r.space) for r in requests]
            answers: list[PolicyResponse | None] = [None] * len(requests)
            pending = list(range(len(requests)))
            behind = 0
            budget = self.deadline  # spent only while sending (a follower's waits have `wait`)
            silent: set[str] = set()  # the servers whose share of this round is not answered yet

            async def send(url: str, share: list[int]) -> dict[int, PolicyResponse]:
                silent.add(url)
                got = await self._share(client, url, share, requests, prompts, params, version)
                silent.discard(url)
                return got

            while pending:
                if self._following and not self._label_seen:
                    await self._await_label(client)
                live = self.live_servers
                if not live:
                    raise PolicyError(
                        f"{self.name}: no server is left for "
                        f"{who([requests[i] for i in pending])}; lost: "
                        + "; ".join(self._lost_why.values())
                    )
                silent.clear()
                # (one server: the batch as asked; its own scheduler orders it for its cache)
                order = by_head(pending, prompts) if len(live) > 1 else pending
                jobs = [
                    functools.partial(send, url, part)
                    for url, part in zip(live, split(order, len(live)), strict=True)
                    if part
                ]
                started = trio.current_time()
                try:
                    with trio.move_on_after(budget) as scope:
                        for got in await concurrently(jobs):
                            for i, answer in got.items():
                                answers[i] = answer
                    budget -= trio.current_time() - started
                    if scope.cancelled_caught:
                        raise PolicyError(
                            f"SGLang server(s) {', '.join(u for u in live if u in silent)} gave "
                            f"no answer for {who([requests[i] for i in pending])} within the "
                            f"batch deadline of {self.deadline:g}s (each try {self.timeout:g}s; "
                            "the spec's deadline=SECONDS and timeout=SECONDS set them)"
                        )
                except _Behind as e:  # (a follower) sent again once the fleet has the version
                    budget -= trio.current_time() - started
                    behind += 1
                    if behind >= self.attempts:
                        raise PolicyError(
                            f"{e}; still so after {behind} waits for {who(requests)}"
                        ) from None
                    self._label_seen = False
                pending = [i for i in pending if answers[i] is None]
            return [a for a in answers if a is not None]

    async def update_weights(
        self,
        path: str | Path | Callable[[], str | Path],
        version: int,
        *,
        tensors: Callable[[], NamedTensors] | None = None,
    ) -> None:
        """Load new weights on every live server and record ``version``: every token sampled
        after this returns carries it. Generation is paused around the load and resumed
        whatever happens.

        ``path`` is a ``save_pretrained`` directory the servers can read, or a function that
        writes one and returns it (called only when the update goes by disk). ``tensors``, when
        given, returns the weights as ``(name, tensor)`` pairs named as the checkpoint names
        them; with :attr:`weights` other than ``"disk"`` they are sent without the disk
        (:mod:`policy.sglang.sync`), and when that cannot work (a server refuses, the group
        cannot form, a step passes ``sync_timeout``) one warning line names the server and the
        cause, and this update and every later one go by disk.

        A server refusing the load raises :class:`PolicyError` naming it; the version is left as
        it was, and if other servers did load the weights, generation is refused until an update
        reaches every server (the fleet may hold mixed weights). A server that cannot be reached
        is lost, as during a batch, and the others are updated.
        """
        if version < 0:
            raise ValueError(f"weight version must be >= 0, got {version}")
        if self._following:
            raise PolicyError(f"{self.name}: a follower does not load weights (see follow)")
        what = f"weights as version {version}"
        label = str(version)
        with trio.move_on_after(self.update_deadline) as scope:
            await self._update(path, version, tensors, what, label)
        if scope.cancelled_caught:  # (the servers were resumed on the way out)
            self._mixed = (
                f"{self.name}: loading {what} did not finish within update_deadline="
                f"{self.update_deadline:g}s (the spec's update-deadline=SECONDS), so the servers "
                "may hold different weights: nothing is generated until an update reaches every "
                "server"
            )
            raise PolicyError(self._mixed)

    async def _update(
        self,
        path: str | Path | Callable[[], str | Path],
        version: int,
        tensors: Callable[[], NamedTensors] | None,
        what: str,
        label: str,
    ) -> None:
        async with self._gate.update(), self.calls.client() as client:
            await self.health.ensure(client, self.live_servers)

            async def pause(url: str) -> None:
                await self.calls.call(client, url, "/pause_generation", {"mode": "abort"}, what)

            async def check(url: str) -> None:
                info = await self.calls.model_info(client, url, what)
                if str(info.get("weight_version")) != label:
                    raise PolicyError(
                        f"SGLang server {url} reports weight_version "
                        f"{info.get('weight_version')!r} after loading {what}"
                    )

            async def resume(url: str) -> None:
                await self.calls.call(client, url, "/continue_generation", {}, what)

            async def resume_all() -> dict[str, Exception]:
                with trio.CancelScope(shield=True):  # never leave a server paused
                    paused_now = [u for u in paused if u not in self.lost_servers]
                    not_resumed = (await self._on_all(paused_now, resume))[1]
                return not_resumed

            paused, failed = await self._on_all(self.live_servers, pause)
            try:
                if failed:
                    raise next(iter(failed.values()))
                new = NewWeights(path, tensors)
                loaded, failed = await self.sync.load(client, paused, new, label, what)
                if not failed:
                    loaded, failed = await self._on_all(loaded, check)
                if failed:
                    bad = next(iter(failed))
                    message = str(failed[bad])
                    if loaded:
                        self._mixed = (
                            f"{message}; {', '.join(loaded)} did load them, so the servers may "
                            "hold different weights: nothing is generated until an update "
                            "reaches every server"
                        )
                        message = self._mixed
                    raise PolicyError(message)
                if not loaded:
                    raise PolicyError(
                        f"{self.name}: no server is left to load {what}; lost: "
                        + "; ".join(self._lost_why.values())
                    )
                self.version, self._label, self._mixed = version, label, None
            except BaseException:
                for url, e in (await resume_all()).items():  # the error in flight is reported
                    log.warning("SGLang server did not continue generation", server=url, why=e)
                raise
            failed = await resume_all()
            if failed:  # a server left paused would hold every request sent to it
                raise next(iter(failed.values()))

    async def aclose(self) -> None:
        for server in self.servers:
            await trio.to_thread.run_sync(server.stop)

    # -- the fleet --------------------------------------------------------------------------------

    async def _share(
        self,
        client: httpx.AsyncClient,
        url: str,
        share: list[int],
        requests: Sequence[PolicyRequest],
        prompts: Sequence[list[int]],
        params: Sequence[dict[str, Any]],
        version: int,
    ) -> dict[int, PolicyResponse]:
        """One server's share of a batch: the answers by request index; those it had not
        answered when it was lost are missing (the caller gives them to the others)."""
        answers: dict[int, PolicyResponse] = {}
        pending, why = list(share), ""
        for attempt in range(self.attempts):
            if attempt:
                await trio.sleep(self.backoff * 2 ** (attempt - 1))
            batch = [requests[i] for i in pending]
            body = {
                "input_ids": [prompts[i] for i in pending],
                "sampling_params": [params[i] for i in pending],
                "return_logprob": True,
            }
            try:
                items = await self.calls.call(client, url, "/generate", body, who(batch))
            except Lost as e:
                self._lose(url, str(e), moved=len(pending))
                return answers
            if isinstance(items, dict) and len(batch) == 1:
                items = [items]
            if not isinstance(items, list) or len(items) != len(batch):
                got = len(items) if isinstance(items, list) else type(items).__name__
                raise PolicyError(
                    f"SGLang server {url}: /generate answered {got} items for {who(batch)}"
                )
            aborted = []
            for i, item in zip(pending, items, strict=True):
                try:
                    answers[i] = self._parse(url, item, requests[i], len(prompts[i]), version)
                except Aborted as e:
                    aborted.append(i)
                    why = str(e)
            pending = aborted
            if not pending:
                return answers
        raise PolicyError(
            f"SGLang server {url}: generation was aborted {self.attempts} times for "
            f"{who([requests[i] for i in pending])} (last: {why})"
        )

    def _lose(self, url: str, why: str, moved: int) -> None:
        self.lost_servers.append(url)
        self._lost_why[url] = why
        if not self.live_servers:  # nothing goes anywhere: the caller's PolicyError says why
            return
        self.requests_moved += moved
        log.warning(
            "SGLang server lost; its requests go to the others",
            server=url,
            why=why,
            requests_moved=moved,
            servers_left=len(self.live_servers),
        )

    async def _on_all(
        self, urls: Sequence[str], step: Callable[[str], Awaitable[None]]
    ) -> tuple[list[str], dict[str, Exception]]:
        """``step`` on every server at once, each to its end: the servers that did it, in order,
        and the errors of those that did not. A server found unreachable is lost."""
        failed: dict[str, Exception] = {}

        async def one(url: str) -> None:
            try:
                await step(url)
            except Lost as e:
                self._lose(url, str(e), moved=0)
            except (PolicyError, ValueError) as e:
                failed[url] = e

        async with trio.open_nursery() as nursery:
            for url in urls:
                nursery.start_soon(one, url)
        done = [u for u in urls if u not in failed and u not in self.lost_servers]
        return done, {u: failed[u] for u in urls if u in failed}

    async def _await_label(self, client: httpx.AsyncClient) -> None:
        """(A follower.) Wait until every live server reports the followed label in
        ``/model_info`` (at most ``wait`` seconds); a later version there is an error at once."""
        if self._label is None:  # the starting weights: checked answer by answer
            self._label_seen = True
            return
        deadline = trio.current_time() + self.wait
        for url in self.live_servers:
            while True:
                got = (await self.calls.model_info(client, url, "its weight version")).get(
                    "weight_version"
                )
                if str(got) == self._label:
                    break
                self._refuse_later(url, got)
                if trio.current_time() >= deadline:
                    raise PolicyError(
                        f"SGLang server {url} still reports weight version {got!r} after "
                        f"{self.wait:g}s; this client follows version {self._label!r} (did the "
                        "learner's update fail?)"
                    )
                await trio.sleep(HEALTH_POLL)
        self._label_seen = True

    def _refuse_later(self, url: str, label: Any) -> None:
        """(A follower.) A server already past the followed version cannot serve it again."""
        try:
            later = int(str(label)) > int(str(self._label))
        except ValueError:  # e.g. "default", the weights a server started with: not later
            later = False
        if later:
            raise PolicyError(
                f"SGLang server {url} reports weight version {label!r}, later than the version "
                f"{self._label!r} this client follows: the weights its requests are pinned to "
                "are gone (was the fleet updated while episodes pinned to them ran?)"
            )

    async def _ensure_tokenizer(self, client: httpx.AsyncClient) -> Any:
        if self._tokenizer is not None:
            return self._tokenizer
        source = self._tokenizer_source
        if source is None:
            if not self.live_servers:
                raise PolicyUnavailable(
                    f"{self.name}: every server is lost; none can name the model"
                )
            url = self.live_servers[0]
            info = await self.calls.model_info(client, url, "the model's tokenizer")
            source = info.get("tokenizer_path") or info.get("model_path")
            if not source or not Path(source).is_dir():
                raise PolicyError(
                    f"SGLang server {url} serves {source!r}, which is not a directory on this "
                    "machine; give the spec tokenizer=DIR, a local copy of the model's tokenizer"
                )
        self._tokenizer = load_tokenizer(source) if isinstance(source, str | Path) else source
        return self._tokenizer

    # -- the protocol's shapes --------------------------------------------------------------------

    def _params(self, r: PolicyRequest) -> dict[str, Any]:
        return sampling_params(r, self.name, self.constraint, self.seeded)

    def _parse(
        self, url: str, item: Any, req: PolicyRequest, n_prompt: int, version: int
    ) -> PolicyResponse:
        """One answer as a response (:func:`policy.sglang.shapes.parse_answer`), its weight
        version checked and its cache hits counted."""
        check = functools.partial(self._check_label, url)
        answer, cached = parse_answer(url, item, req, n_prompt, version, self._tokenizer, check)
        self.cached_tokens += cached
        return answer

    def _check_label(self, url: str, label: Any, bad: Callable[[str], PolicyError]) -> None:
        """The weight version a server reports must be the one this client loaded, or, before
        any load, the same on every server."""
        if label is None:
            return
        label = str(label)
        if self._following and self._label is not None and label != self._label:
            self._refuse_later(url, label)
            raise _Behind(
                f"SGLang server {url} answered with weight version {label!r}, not the followed "
                f"{self._label!r}"
            )
        if self._label is not None:
            if label != self._label:
                raise bad(
                    f"the server reports weight version {label!r} but this client loaded "
                    f"{self._label!r} (did another client update the weights?)"
                )
        elif self._first_label is None:
            self._first_label = (url, label)
        elif self._first_label[1] != label:
            raise bad(
                f"the server reports weight version {label!r} but {self._first_label[0]} "
                f"reports {self._first_label[1]!r}: the servers hold different weights"
            )


# -- the policy a spec names ---------------------------------------------------------------------


def policy_from_spec(arg: str, *, command: Sequence[str] | None = None) -> SGLangPolicy:
    """The policy an ``sglang:`` spec names (``arg`` follows ``sglang:``), its server launched
    first for ``launch:``. ``command`` replaces ``sglang serve`` (tests start a stand-in)."""
    spec = parse_spec(arg)
    api_key = None
    if spec.api_key_env:
        api_key = os.environ.get(spec.api_key_env)
        if not api_key:
            raise ValueError(
                f"policy sglang:{arg}: api-key-env={spec.api_key_env}, but that environment "
                "variable is not set"
            )
    if spec.tokenizer and not Path(spec.tokenizer).is_dir():
        raise ValueError(
            f"policy sglang:{arg}: tokenizer directory {spec.tokenizer!r} does not exist"
        )
    common: dict[str, Any] = {
        "seeded": spec.seeds,
        "api_key": api_key,
        "wait": spec.wait,
        "timeout": spec.timeout,
        "deadline": spec.deadline,
        "weights": spec.weights,
        "sync_timeout": spec.sync_timeout,
        "update_deadline": spec.update_deadline,
        "constraint": spec.constraint,
        "name": f"sglang:{arg}",
    }
    if not spec.model:
        return SGLangPolicy(spec.urls, tokenizer=spec.tokenizer or None, **common)
    if not Path(spec.model).is_dir():
        raise ValueError(f"policy sglang:{arg}: model directory {spec.model!r} does not exist")
    server = SGLangServer.launch(
        spec.model, args=spec.launch_args(api_key), command=command, timeout=spec.wait
    )
    tokenizer = spec.tokenizer or spec.model
    return SGLangPolicy([server.url], tokenizer=tokenizer, servers=[server], **common)

"""The SGLang backend: one policy served by a fleet of SGLang servers over their native HTTP API.

Written against sglang 0.5.3 and later: 0.5.3 is the first release whose sampling parameters
have ``sampling_seed``, so every seeded request fails on 0.5.1 and 0.5.2. Every request and
response shape below is SGLang's own; where each comes from is cited next to the code that uses
it (paths are in sgl-project/sglang):

- ``POST /generate`` takes ``GenerateReqInput`` (docs/basic_usage/sampling_params.md;
  python/sglang/srt/managers/io_struct.py): ``input_ids`` as a list of lists makes a batch,
  ``sampling_params`` one dict per prompt, ``return_logprob`` asks for the logprob of every
  output token. A batch answers a JSON list, one ``{"text", "output_ids", "meta_info"}`` per
  prompt, in order (python/sglang/srt/managers/tokenizer_manager.py, _handle_batch_request).
- ``meta_info`` holds ``finish_reason`` (``{"type": "stop"|"length"|"abort", ...}``),
  ``prompt_tokens``, ``weight_version`` and ``output_token_logprobs``: one ``[logprob, token_id,
  text-or-null]`` per output token. Those logprobs are of the distribution SGLang sampled from:
  logits divided by the temperature, with the grammar's vocabulary mask applied
  (python/sglang/srt/layers/sampler.py), unless the server runs with
  SGLANG_RETURN_ORIGINAL_LOGPROB.
- An aborted prompt: an abort that carries ``status_code`` 400 (an invalid grammar) fails the
  whole request with HTTP 400, one with 500 or 503 fails it with that status; a plain abort (a
  ``/pause_generation`` in ``abort`` mode, another client's ``/abort_request``) comes back as its
  item with ``finish_reason.type == "abort"`` in an HTTP 200 answer (tokenizer_manager.py,
  _wait_one_response and _handle_abort_req). The first is an error, the second is sent again.
- Sampling parameters (python/sglang/srt/sampling/sampling_params.py): ``temperature``,
  ``max_new_tokens``, ``top_p``/``top_k``/``min_p`` and the penalties (sent explicitly, because a
  server started with the default ``--sampling-defaults model`` takes them from the model's
  generation_config.json and would sample from a truncated distribution the learner cannot
  recompute), one of ``regex``/``ebnf``, and ``sampling_seed``. An unknown key is a TypeError
  there, which /generate does not catch: HTTP 500.
- ``sampling_seed`` is read only by a server started with ``--enable-deterministic-inference``
  (python/sglang/srt/sampling/sampling_batch_info.py builds the seed tensor only then, and fills
  seed 42 for a request without one); any other server accepts the key and samples as if it were
  absent. So this client reads each server's settings (``GET /server_info``, ``/get_server_info``
  before it was renamed: ServerArgs as a dict plus ``version``) and refuses to send seeds to a
  server that does not report ``enable_deterministic_inference: true`` on sglang >= 0.5.3.
  ``seeds=off`` sends none, and says so in a warning: a replay then samples other tokens.
- Weight sync (docs/advanced_features/sglang_for_rl.md): ``POST /pause_generation``
  ``{"mode": "abort"}`` (the default mode; servers before the modes existed ignore the body),
  then the load, then ``GET /model_info`` (``/get_model_info`` before the rename) must report the
  ``weight_version`` just sent, on every server, before ``POST /continue_generation`` ``{}``.
  The load (``weights=``; io_struct.py for every field): ``disk`` is ``POST
  /update_weights_from_disk`` ``{"model_path", "abort_all_requests", "weight_version"}``
  answering ``{"success", "message", "num_paused_requests"}`` (HTTP 400 when it failed).
  ``distributed``: ``POST /init_weights_update_group`` ``{"master_address", "master_port",
  "rank_offset", "world_size", "group_name", "backend"}`` once (the learner is rank 0 and hosts
  the rendezvous; each server's ranks follow, ``tp_size`` of them; NCCL for GPU tensors, gloo
  for CPU ones), then per bucket ``POST /update_weights_from_distributed`` ``{"names", "dtypes",
  "shapes", "group_name", "load_format": "flattened_bucket", "flush_cache",
  "abort_all_requests", "weight_version"}`` while the learner broadcasts the bucket's bytes
  (:mod:`policy.sglang.weights` has the layout). ``tensor``: ``POST
  /update_weights_from_tensor`` ``{"serialized_named_tensors"`` (one entry per TP rank),
  ``"load_format", "flush_cache", "abort_all_requests", "weight_version"}``. The label rides on
  the last call only, so a server reports it once it holds every tensor; ``abort_all_requests``
  is false (the pause already aborted what ran). The in-memory calls are never retried (half a
  collective cannot be sent twice) and each step (forming the group, one bucket) is bounded by
  ``sync_timeout``; a refusal, a group that cannot form or a step past it is one warning line
  naming the server and the cause, and the update, and every later one, goes by disk.
- ``GET /health`` answers 503 while the server starts and 200 once it serves; ``--api-key``
  servers want ``Authorization: Bearer KEY`` on everything but /health
  (python/sglang/srt/utils, add_api_key_middleware).
- A server this program starts itself (``sglang:launch:``) is :mod:`policy.sglang.server`.

**The fleet.** Each batch is ordered by its prompts' token ids (:func:`by_head`) and split into
contiguous, near-equal shares, one per live server, sent at once. Sorted order is the depth-first
order of the prompts' trie, the structure SGLang's radix cache keeps, so prompts that share a head
(one action space's header and tool list, then whatever else they share) sit side by side and
each contiguous share is a run of neighbouring subtrees: a server prefills a shared head once,
while the shares stay within one request of each other in size. It matters where heads differ
and arrive interleaved (several roles' spaces, a shared transcript at the prompt's head); the
workshop's prompts share the header and tool list and little else, and the conductor asks
episode by episode, so there arrival order did nearly as well (a 48-request workshop batch over
3 servers: 76.5% of prompt tokens served from cache sorted, 75.3% in arrival order, 79.8% on one
server; ``tests/policy/test_sglang.py`` measures both). The order is a function of the prompts
alone, so it is deterministic, and a request is seeded and batch-independent, so which server
answers it cannot change the answer (on servers of the same build, GPU type and flags).
:attr:`SGLangPolicy.cached_tokens` sums the ``cached_tokens`` the servers report.

A call that fails with a connection refused or dropped, a timeout, HTTP 429 or 5xx is retried
with exponential backoff, a bounded number of times; a server still unreachable after that is
*lost*: its share goes to the others, a structlog warning says so, and
:attr:`SGLangPolicy.lost_servers` and
:attr:`SGLangPolicy.requests_moved` count it. The run goes on while one server is left (the last
one lost is no warning: it is the :class:`PolicyError` that follows). Any other error status and
any answer that is not the documented shape raise :class:`PolicyError` naming the server and the
request (agent, turn): never a silently wrong answer.

**Time.** Three bounds, so that a server that accepts connections and never answers cannot hold a
run for longer than the user chose. ``timeout`` bounds one attempt at one call (default 120 s: a
``/generate`` share answers in seconds to a minute, its length bounded by ``max_new_tokens``);
the light GETs (``/health``, ``/server_info``, ``/model_info``) get at most
:data:`_QUICK_TIMEOUT`, because SGLang answers ``/health`` within its own
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

import contextlib
import functools
import math
import os
import re
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import structlog
import trio

from collective.base.actions import ActionSpace
from policy.base import PolicyError, PolicyRequest, PolicyResponse, PolicyUnavailable
from policy.constraint import action_ebnf, action_regex
from policy.hf.prompt import load_tokenizer, prompt_ids
from policy.sglang.server import HEALTH_POLL, SGLangServer, free_port
from policy.sglang.spec import WEIGHTS_METHODS, Constraint, WeightsMethod, parse_spec

log = structlog.get_logger("policy.sglang.client")

MIN_SGLANG = (0, 5, 3)  # the first release with sampling_seed
_SEED_MASK = (1 << 63) - 1  # SGLang keeps seeds in int64 tensors
_MIN_TEMPERATURE = 1e-5  # SGLang treats lower temperatures as greedy decoding
_LOGPROB_SLACK = 1e-3  # a logprob above this is not rounding, it is a broken answer
# The most one light GET (/health, /server_info, /model_info) may take: SGLang's /health answers
# within SGLANG_HEALTH_CHECK_TIMEOUT (20 s by default) plus its 1 s poll, the others at once.
_QUICK_TIMEOUT = 30.0
T = TypeVar("T")
NamedTensors = Sequence[tuple[str, Any]]  # (name, torch.Tensor) as the checkpoint names them


@functools.lru_cache(maxsize=256)
def _constraint(space: ActionSpace, kind: Constraint) -> str:
    return action_regex(space) if kind == "regex" else action_ebnf(space)


def _who(requests: Sequence[PolicyRequest]) -> str:
    shown = ", ".join(f"agent {r.agent} turn {r.turn}" for r in requests[:3])
    more = f" and {len(requests) - 3} more" if len(requests) > 3 else ""
    return f"{len(requests)} request(s): {shown}{more}"


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


def _excerpt(text: Any, limit: int) -> str:
    """The start of a server's answer on one line (errors are one line)."""
    return " ".join(str(text).split())[:limit]


def _version_tuple(text: Any) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", str(text)) if text is not None else None
    return tuple(int(g) for g in match.groups()) if match else None


def _bucket_control(last: bool, label: str) -> dict[str, Any]:
    """The control fields of one in-memory bucket: requests are never aborted (explicitly), and
    only the last bucket flushes the cache and carries the version label, so a server reports
    the label once it holds every tensor."""
    return {
        "flush_cache": last,
        "abort_all_requests": False,
        "weight_version": label if last else None,
    }


async def _concurrently(jobs: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
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


class _Unreachable(Exception):
    """No HTTP answer: refused, dropped, timed out (the message says which)."""


class _NoMemory(Exception):
    """An in-memory weight transfer that cannot work; the message is one line naming the server
    (or the learner) and the cause, and the update goes by disk."""


def _is_local(url: str) -> bool:
    host = httpx.URL(url).host
    return host in ("127.0.0.1", "localhost", "::1") or host == socket.gethostname()


class _Lost(PolicyUnavailable):
    """A server that stayed unreachable through every retry."""


class _Aborted(Exception):
    """The server aborted one prompt of a batch, e.g. because generation was paused."""


class _Behind(Exception):
    """(A follower.) A server answered with weights other than the version being followed."""


class _Gate:
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


class SGLangPolicy:
    """A :class:`policy.base.Policy` served by the SGLang servers at ``urls`` (see the module
    docstring for how a batch is shared and what happens when a server is lost).

    ``tokenizer`` is the model's Hugging Face tokenizer (a local directory, or a loaded tokenizer);
    by default it is read from the directory the first server reports in ``/model_info``, which
    works when the servers run on this machine. ``constraint`` picks how actions are constrained (a
    regex works with every SGLang grammar backend; EBNF needs XGrammar or llguidance). ``seeded``
    sends each request's seed as ``sampling_seed`` and then requires every server to run with
    ``--enable-deterministic-inference``. ``api_key`` is sent as ``Authorization: Bearer``.
    ``timeout`` bounds one attempt at one HTTP call (a light GET: at most :data:`_QUICK_TIMEOUT`);
    ``attempts`` bounds the tries of one call, ``backoff`` is the first pause between them
    (doubling after each); ``deadline`` bounds one :meth:`generate` in all (its sends, retries and
    resends; not the one-time readiness check); ``wait`` bounds how long a server may answer
    /health with 503 (starting) before the first batch. ``weights`` picks how
    :meth:`update_weights` loads new weights (``disk``, ``distributed``, ``tensor`` or ``auto``;
    the module docstring), ``sync_timeout`` bounds each step of an in-memory load,
    ``update_deadline`` one :meth:`update_weights` in all (every call, retry, bucket and the
    fallback to the disk: the per-call bounds alone add up to hours over a fleet),
    ``bucket_bytes`` the bytes of one bucket, ``group_host`` the address the servers reach this
    process at for the weight-update group (default: loopback when every server is local, else
    this host's name resolved).

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
        self.servers = tuple(servers)
        self.lost_servers: list[str] = []  # in the order they were lost
        self.requests_moved = 0  # requests sent again to another server after theirs was lost
        self.cached_tokens = 0  # prompt tokens the servers' radix caches served (their report)
        self._lost_why: dict[str, str] = {}
        self._tls: ssl.SSLContext | None = None  # made on first use (_client)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._tokenizer_source = tokenizer
        self._tokenizer: Any = None
        self._ready = False
        self._ready_lock = trio.Lock()
        self._label: str | None = None  # the weight_version we told the servers, once we have
        self._first_label: tuple[str, str] | None = None  # (server, label) before any update
        self._mixed: str | None = None  # why the fleet may hold mixed weights
        self._gate = _Gate()
        self._following = False  # a follower: another client loads the weights (see follow)
        self._label_seen = False  # (a follower) every live server reported _label since follow
        self.weights: WeightsMethod = weights
        self.sync_timeout = sync_timeout
        self.update_deadline = update_deadline
        self.bucket_bytes = bucket_bytes
        self.group_host = group_host
        self.weights_by_disk_why: str | None = None  # set when a sync fell back to the disk
        self.last_sync_method: str | None = None  # how the last update reached the servers
        self._group: Any = None  # the learner's UpdateGroup, once formed
        self._group_members: tuple[str, ...] = ()  # the servers in it, in rank order
        self._groups = 0  # groups formed so far (each gets a new name)
        self._server_args: dict[str, dict[str, Any]] = {}  # /server_info, by server

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
            "api_key": self._headers.get("Authorization", "").removeprefix("Bearer ") or None,
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
        async with self._gate.batch(), self._client() as client:
            if self._mixed:
                raise PolicyError(self._mixed)
            version = self.version
            pinned = [r for r in requests if r.version not in (-1, version)]
            if pinned:  # the servers hold one set of weights: they cannot answer for another
                wanted = sorted({r.version for r in pinned})
                raise PolicyError(
                    f"{self.name} holds policy version {version}, but {_who(pinned)} are "
                    f"pinned to version(s) {wanted}"
                )
            params = [self._params(r) for r in requests]
            await self._ensure_ready(client)
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
                        f"{_who([requests[i] for i in pending])}; lost: "
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
                        for got in await _concurrently(jobs):
                            for i, answer in got.items():
                                answers[i] = answer
                    budget -= trio.current_time() - started
                    if scope.cancelled_caught:
                        raise PolicyError(
                            f"SGLang server(s) {', '.join(u for u in live if u in silent)} gave "
                            f"no answer for {_who([requests[i] for i in pending])} within the "
                            f"batch deadline of {self.deadline:g}s (each try {self.timeout:g}s; "
                            "the spec's deadline=SECONDS and timeout=SECONDS set them)"
                        )
                except _Behind as e:  # (a follower) sent again once the fleet has the version
                    budget -= trio.current_time() - started
                    behind += 1
                    if behind >= self.attempts:
                        raise PolicyError(
                            f"{e}; still so after {behind} waits for {_who(requests)}"
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
        them; with :attr:`weights` other than ``"disk"`` they are sent without the disk (see the
        module docstring), and when that cannot work (a server refuses, the group cannot form,
        a step passes ``sync_timeout``) one warning line names the server and the cause, and
        this update and every later one go by disk.

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
        async with self._gate.update(), self._client() as client:
            await self._ensure_ready(client)

            async def pause(url: str) -> None:
                await self._call(client, url, "/pause_generation", {"mode": "abort"}, what)

            async def check(url: str) -> None:
                info = await self._model_info(client, url, what)
                if str(info.get("weight_version")) != label:
                    raise PolicyError(
                        f"SGLang server {url} reports weight_version "
                        f"{info.get('weight_version')!r} after loading {what}"
                    )

            async def resume(url: str) -> None:
                await self._call(client, url, "/continue_generation", {}, what)

            async def resume_all() -> dict[str, Exception]:
                with trio.CancelScope(shield=True):  # never leave a server paused
                    paused_now = [u for u in paused if u not in self.lost_servers]
                    not_resumed = (await self._on_all(paused_now, resume))[1]
                return not_resumed

            paused, failed = await self._on_all(self.live_servers, pause)
            try:
                if failed:
                    raise next(iter(failed.values()))
                loaded, failed = await self._load(client, paused, path, tensors, label, what)
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

    # -- weight transfer --------------------------------------------------------------------------

    async def _load(
        self,
        client: httpx.AsyncClient,
        urls: list[str],
        path: str | Path | Callable[[], str | Path],
        tensors: Callable[[], NamedTensors] | None,
        label: str,
        what: str,
    ) -> tuple[list[str], dict[str, Exception]]:
        """Put the weights on the paused servers ``urls``, in memory when it can work, else from
        the disk: the servers that loaded them and the errors of those that did not."""
        if urls and tensors is not None and self.weights != "disk" and not self.weights_by_disk_why:
            named = list(tensors())
            method = self._method(urls, named)
            try:
                if method == "tensor":
                    await self._by_tensor(client, urls, named, label, what)
                elif method == "distributed":
                    await self._by_distributed(client, urls, named, label, what)
                if method != "disk":
                    self.last_sync_method = method
                    return list(urls), {}
            except _NoMemory as e:
                self._group_gone()
                self.weights_by_disk_why = str(e)
                log.warning(
                    f"{e}; weights go to the servers by disk (update_weights_from_disk) from now "
                    "on",
                    policy=self.name,
                )
        directory = str(path() if callable(path) else path)

        async def load(url: str) -> None:
            body = {"model_path": directory, "abort_all_requests": False, "weight_version": label}
            reply = await self._call(
                client, url, "/update_weights_from_disk", body, what, refusal=True
            )
            if not (isinstance(reply, dict) and reply.get("success") is True):
                message = reply.get("message") if isinstance(reply, dict) else reply
                raise PolicyError(
                    f"SGLang server {url} refused to load {what} from {directory!r}: "
                    f"{_excerpt(message, 300)}"
                )

        self.last_sync_method = "disk"
        return await self._on_all(urls, load)

    def _method(self, urls: Sequence[str], named: NamedTensors) -> str:
        """How the weights go this time: ``tensor`` needs the servers on this machine and the
        tensors on a GPU (CUDA IPC; CPU tensors would travel as file descriptors, which an
        unrelated process cannot open), ``distributed`` a group every server can join (one
        data-parallel rank each: a dp_size > 1 server is loaded from the disk)."""
        if not named:
            raise PolicyError(f"{self.name}: the learner gave no tensors to send")
        multi = [u for u in urls if int(self._server_args.get(u, {}).get("dp_size") or 1) > 1]
        if multi:
            self.weights_by_disk_why = (
                f"SGLang server {multi[0]} runs dp_size > 1, which this client does not put in "
                "a weight-update group"
            )
            log.warning(self.weights_by_disk_why + "; weights go by disk", policy=self.name)
            return "disk"
        if self.weights != "auto":
            return self.weights
        on_gpu = getattr(named[0][1], "is_cuda", False)
        local = all(_is_local(u) for u in urls)
        return "tensor" if on_gpu and local else "distributed"

    async def _once(
        self, client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any], what: str
    ) -> None:
        """One control call of an in-memory update, not retried (the server's half of a
        collective cannot be sent twice): :class:`_NoMemory` naming the server and the cause
        when it is not answered ``{"success": true}``."""
        try:
            r = await client.post(url + path, json=body, timeout=self.sync_timeout)
        except (httpx.TimeoutException, httpx.TransportError) as e:
            raise _NoMemory(f"SGLang server {url}: {path} for {what}: {type(e).__name__}") from e
        try:
            reply = r.json()
        except ValueError:
            reply = {"message": r.text}
        if r.status_code != 200 or not (isinstance(reply, dict) and reply.get("success") is True):
            message = reply.get("message") if isinstance(reply, dict) else reply
            raise _NoMemory(
                f"SGLang server {url} refused {path} for {what} (HTTP {r.status_code}): "
                f"{_excerpt(message, 300)}"
            )

    async def _by_tensor(
        self,
        client: httpx.AsyncClient,
        urls: list[str],
        named: NamedTensors,
        label: str,
        what: str,
    ) -> None:
        """``/update_weights_from_tensor`` (io_struct.py, UpdateWeightsFromTensorReqInput:
        ``serialized_named_tensors`` one entry per TP rank, ``load_format``, ``flush_cache``,
        ``abort_all_requests``, ``weight_version``), bucket by bucket; the label goes with the
        last bucket, so a server reports it only once it holds every tensor."""
        from policy.sglang.weights import buckets, serialize_named_tensors

        parts = buckets(named, self.bucket_bytes)
        for k, bucket in enumerate(parts):
            last = k == len(parts) - 1
            entry = await trio.to_thread.run_sync(serialize_named_tensors, bucket)

            async def send(url: str, entry: str = entry, last: bool = last) -> None:
                tp = int(self._server_args.get(url, {}).get("tp_size") or 1)
                body = {
                    "serialized_named_tensors": [entry] * tp,
                    "load_format": None,
                    **_bucket_control(last, label),
                }
                with trio.move_on_after(self.sync_timeout) as scope:
                    await self._once(client, url, "/update_weights_from_tensor", body, what)
                if scope.cancelled_caught:
                    raise _NoMemory(
                        f"SGLang server {url}: /update_weights_from_tensor for {what} gave no "
                        f"answer within sync_timeout={self.sync_timeout:g}s"
                    )

            await _concurrently([functools.partial(send, url) for url in urls])

    async def _by_distributed(
        self,
        client: httpx.AsyncClient,
        urls: list[str],
        named: NamedTensors,
        label: str,
        what: str,
    ) -> None:
        """``/update_weights_from_distributed`` (io_struct.py,
        UpdateWeightsFromDistributedReqInput: ``names``, ``dtypes``, ``shapes``, ``group_name``,
        ``flush_cache``, ``abort_all_requests``, ``weight_version``, ``load_format``) with
        ``load_format: "flattened_bucket"``, one call per bucket, while this process broadcasts
        the bucket's bytes over the group (rank 0). Each bucket is bounded by ``sync_timeout``."""
        from policy.sglang.weights import buckets, dtype_name, flatten

        if self._group is None or self._group_members != tuple(urls):
            self._group_gone()
            await self._form_group(client, urls, named)
        group = self._group
        parts = buckets(named, self.bucket_bytes)
        for k, bucket in enumerate(parts):
            last = k == len(parts) - 1
            flat = flatten(bucket)
            body = {
                "names": [n for n, _ in bucket],
                "dtypes": [dtype_name(t) for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "group_name": group.group_name,
                "load_format": "flattened_bucket",
                **_bucket_control(last, label),
            }
            await self._bucket(client, urls, group, flat, body, f"bucket {k + 1}/{len(parts)}")

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
            await self._once(client, url, "/update_weights_from_distributed", body, what)
            waiting.discard(url)

        async def broadcast() -> None:
            try:
                await trio.to_thread.run_sync(group.broadcast, flat, abandon_on_cancel=True)
            except RuntimeError as e:
                raise _NoMemory(
                    f"the broadcast of {which} to {', '.join(urls)} failed: {_excerpt(e, 200)}"
                ) from e
            waiting.discard("the learner's broadcast")

        jobs: list[Callable[[], Awaitable[None]]] = [functools.partial(post, u) for u in urls]
        with trio.move_on_after(self.sync_timeout) as scope:
            await _concurrently([*jobs, broadcast])
        if scope.cancelled_caught:
            raise _NoMemory(
                f"SGLang server(s) {', '.join(sorted(waiting))} did not finish {which} within "
                f"sync_timeout={self.sync_timeout:g}s (a hung collective)"
            )

    async def _form_group(
        self, client: httpx.AsyncClient, urls: list[str], named: NamedTensors
    ) -> None:
        """``/init_weights_update_group`` on every server at once (io_struct.py,
        InitWeightsUpdateGroupReqInput: ``master_address``, ``master_port``, ``rank_offset``,
        ``world_size``, ``group_name``, ``backend``) while this process joins as rank 0: each
        server's ranks follow the ranks of the servers before it (its ``tp_size`` each)."""
        from policy.sglang.weights import UpdateGroup

        ranks = [int(self._server_args.get(u, {}).get("tp_size") or 1) for u in urls]
        world = 1 + sum(ranks)
        local = all(_is_local(u) for u in urls)
        host = self.group_host or ("127.0.0.1" if local else socket.gethostbyname(socket.getfqdn()))
        backend = "nccl" if getattr(named[0][1], "is_cuda", False) else "gloo"
        self._groups += 1
        name = f"collective-weights-{os.getpid()}-{self._groups}"
        port = free_port()
        try:
            group = UpdateGroup(host, port, world, name, backend, self.sync_timeout)
        except (OSError, RuntimeError) as e:  # e.g. the port was taken meanwhile
            raise _NoMemory(
                f"the learner cannot host weight-update group {name} at {host}:{port}: "
                f"{_excerpt(e, 200)}"
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
            await self._once(client, url, "/init_weights_update_group", body, f"group {name}")
            waiting.discard(url)

        async def join() -> None:
            try:
                await trio.to_thread.run_sync(group.join, abandon_on_cancel=True)
            except RuntimeError as e:
                raise _NoMemory(
                    f"weight-update group {name} ({world} ranks) did not form: {_excerpt(e, 200)}"
                ) from e
            waiting.discard("the learner")

        jobs: list[Callable[[], Awaitable[None]]] = [
            functools.partial(init, u, o) for u, o in zip(urls, offsets, strict=True)
        ]
        try:
            with trio.move_on_after(self.sync_timeout) as scope:
                await _concurrently([*jobs, join])
        except BaseException:
            group.close()
            raise
        if scope.cancelled_caught:
            group.close()
            raise _NoMemory(
                f"weight-update group {name} ({world} ranks at {host}:{port}) did not form "
                f"within sync_timeout={self.sync_timeout:g}s; waiting on "
                + ", ".join(sorted(waiting))
            )
        self._group, self._group_members = group, tuple(urls)

    def _group_gone(self) -> None:
        """Drop the learner's side of the group (the servers' side is left to their timeout)."""
        if self._group is not None:
            self._group.close()
        self._group, self._group_members = None, ()

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
                items = await self._call(client, url, "/generate", body, _who(batch))
            except _Lost as e:
                self._lose(url, str(e), moved=len(pending))
                return answers
            if isinstance(items, dict) and len(batch) == 1:
                items = [items]
            if not isinstance(items, list) or len(items) != len(batch):
                got = len(items) if isinstance(items, list) else type(items).__name__
                raise PolicyError(
                    f"SGLang server {url}: /generate answered {got} items for {_who(batch)}"
                )
            aborted = []
            for i, item in zip(pending, items, strict=True):
                try:
                    answers[i] = self._parse(url, item, requests[i], len(prompts[i]), version)
                except _Aborted as e:
                    aborted.append(i)
                    why = str(e)
            pending = aborted
            if not pending:
                return answers
        raise PolicyError(
            f"SGLang server {url}: generation was aborted {self.attempts} times for "
            f"{_who([requests[i] for i in pending])} (last: {why})"
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
            except _Lost as e:
                self._lose(url, str(e), moved=0)
            except (PolicyError, ValueError) as e:
                failed[url] = e

        async with trio.open_nursery() as nursery:
            for url in urls:
                nursery.start_soon(one, url)
        done = [u for u in urls if u not in failed and u not in self.lost_servers]
        return done, {u: failed[u] for u in urls if u in failed}

    async def _ensure_ready(self, client: httpx.AsyncClient) -> None:
        """Once: every server healthy (503 while it starts is waited out) and, when seeds are
        sent, every server one that honours them."""
        async with self._ready_lock:
            if self._ready:
                return
            jobs = [functools.partial(self._check_server, client, u) for u in self.live_servers]
            await _concurrently(jobs)
            if not self.seeded:
                log.warning(
                    "seeds are off: each SGLang request is sampled without its seed, so a "
                    "replay of this run will not sample the same tokens",
                    policy=self.name,
                )
            self._ready = True

    async def _check_server(self, client: httpx.AsyncClient, url: str) -> None:
        await self._wait_healthy(client, url)
        info, path = await self._first_of(
            client, url, ("/server_info", "/get_server_info"), "the server's settings"
        )
        self._server_args[url] = info
        deterministic = info.get("enable_deterministic_inference")
        release = _version_tuple(info.get("version"))
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
                r = await self._request(client, url, "/health", None)
            except _Unreachable as e:
                unreachable += 1
                if unreachable >= self.attempts:
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
                        f"{_excerpt(r.text, 200)}"
                    )
                why = "HTTP 503, still starting"
            if trio.current_time() >= deadline:
                raise PolicyError(
                    f"SGLang server {url} was not ready after {self.wait:g}s (last: {why}); a "
                    "large model takes minutes to load: give the spec a longer wait=SECONDS"
                )
            await trio.sleep(HEALTH_POLL)

    async def _model_info(self, client: httpx.AsyncClient, url: str, what: str) -> dict[str, Any]:
        info, _ = await self._first_of(client, url, ("/model_info", "/get_model_info"), what)
        return info

    async def _await_label(self, client: httpx.AsyncClient) -> None:
        """(A follower.) Wait until every live server reports the followed label in
        ``/model_info`` (at most ``wait`` seconds); a later version there is an error at once."""
        if self._label is None:  # the starting weights: checked answer by answer
            self._label_seen = True
            return
        deadline = trio.current_time() + self.wait
        for url in self.live_servers:
            while True:
                got = (await self._model_info(client, url, "its weight version")).get(
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

    async def _first_of(
        self, client: httpx.AsyncClient, url: str, paths: Sequence[str], what: str
    ) -> tuple[dict[str, Any], str]:
        """The first of ``paths`` the server has (newer SGLang renamed /get_X to /X and keeps the
        old name as an alias; older servers answer 404 to the new one)."""
        for path in paths:
            got = await self._call(client, url, path, None, what, missing_ok=True)
            if got is None:
                continue
            if not isinstance(got, dict):
                raise PolicyError(f"SGLang server {url}: {path} answered {str(got)[:200]!r}")
            return got, path
        raise PolicyError(f"SGLang server {url} answers none of {', '.join(paths)} ({what})")

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
            info = await self._model_info(client, url, "the model's tokenizer")
            source = info.get("tokenizer_path") or info.get("model_path")
            if not source or not Path(source).is_dir():
                raise PolicyError(
                    f"SGLang server {url} serves {source!r}, which is not a directory on this "
                    "machine; give the spec tokenizer=DIR, a local copy of the model's tokenizer"
                )
        self._tokenizer = load_tokenizer(source) if isinstance(source, str | Path) else source
        return self._tokenizer

    # -- HTTP -------------------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        # A client per call: a connection pool belongs to one event loop, and a policy outlives
        # many trio.run calls (one per episode batch or fork). One TCP connect per server per GPU
        # batch is nothing next to the batch.
        # The TLS context is made once: httpx would otherwise build a default one for every
        # client, loading the system's CA certificates each time (38 ms of CPU a batch here,
        # measured by bench/sglang_client.py: more than the rest of a 64-request batch).
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout, connect=min(10.0, self.timeout)),
            headers=self._headers,
            verify=self._tls,
        )

    async def _request(
        self, client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any] | None
    ) -> httpx.Response:
        limit = self.timeout if body is not None else min(self.timeout, _QUICK_TIMEOUT)
        try:
            if body is None:
                timeout = httpx.Timeout(limit, connect=min(10.0, limit))
                return await client.get(url + path, timeout=timeout)
            return await client.post(url + path, json=body)
        except httpx.TimeoutException as e:
            raise _Unreachable(f"timed out after {limit:g}s ({type(e).__name__})") from e
        except httpx.TransportError as e:  # refused, reset, dropped mid-answer
            raise _Unreachable(f"{type(e).__name__}: {e}") from e

    async def _call(
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
        why). :class:`_Lost` when the server stayed unreachable."""
        last, unreachable = "", False
        for attempt in range(self.attempts):
            if attempt:
                await trio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                r = await self._request(client, url, path, body)
            except _Unreachable as e:
                last, unreachable = str(e), True
                continue
            if r.status_code == 429 or r.status_code >= 500:
                last, unreachable = f"HTTP {r.status_code}: {_excerpt(r.text, 300)}", False
                continue
            if r.status_code == 404 and missing_ok:
                return None
            if r.status_code >= 400 and not (refusal and r.status_code == 400):
                hint = " (wrong or missing API key?)" if r.status_code == 401 else ""
                raise PolicyError(
                    f"SGLang server {url}: {path} for {what} was refused with HTTP "
                    f"{r.status_code}{hint}: {_excerpt(r.text, 500)}"
                )
            try:
                return r.json()
            except ValueError:
                raise PolicyError(
                    f"SGLang server {url}: {path} for {what} answered something that is not "
                    f"JSON: {r.text[:200]!r}"
                ) from None
        failure = _Lost if unreachable else PolicyError
        raise failure(
            f"SGLang server {url}: {path} for {what} failed {self.attempts} times (last: {last})"
        )

    # -- the protocol's shapes --------------------------------------------------------------------

    def _params(self, r: PolicyRequest) -> dict[str, Any]:
        if r.temperature < _MIN_TEMPERATURE:
            raise PolicyError(
                f"{self.name}: agent {r.agent} turn {r.turn} asks temperature {r.temperature}; "
                f"below {_MIN_TEMPERATURE} SGLang samples greedily and its logprobs are not the "
                "sampling distribution's"
            )
        if r.top_p != 1.0:
            # The learner's ratios need the behaviour logprobs of the distribution sampled;
            # whether SGLang's reported logprobs are taken before or after its nucleus is
            # renormalised is not checked here, so a nucleus is sampled in-process only.
            raise PolicyError(
                f"{self.name}: agent {r.agent} turn {r.turn} asks top_p {r.top_p}; the SGLang "
                "client samples with top_p = 1 only (hf:DIR samples a nucleus)"
            )
        p: dict[str, Any] = {
            "temperature": r.temperature,
            "max_new_tokens": r.max_tokens,
            "top_p": 1.0,
            "top_k": -1,
            "min_p": 0.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "repetition_penalty": 1.0,
            self.constraint: _constraint(r.space, self.constraint),
        }
        if self.seeded:
            p["sampling_seed"] = r.seed & _SEED_MASK
        return p

    def _parse(
        self, url: str, item: Any, req: PolicyRequest, n_prompt: int, version: int
    ) -> PolicyResponse:
        """One answer as a response; :class:`_Aborted` when the server aborted it for a reason
        that may pass (a pause), a :class:`PolicyError` for any other answer."""

        def bad(why: str) -> PolicyError:
            return PolicyError(
                f"SGLang server {url}: malformed /generate answer for agent {req.agent} "
                f"turn {req.turn}: {why}"
            )

        meta = item.get("meta_info") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            raise bad(f"no meta_info in {str(item)[:200]}")
        finish = meta.get("finish_reason")
        reason: dict[str, Any] = finish if isinstance(finish, dict) else {}
        kind = reason.get("type")
        if kind == "abort":
            status = reason.get("status_code")
            if isinstance(status, int) and 400 <= status < 500 and status != 429:
                raise bad(f"the server refused it: {reason.get('message')!r}")
            raise _Aborted(str(reason.get("message", "aborted")))
        if kind not in ("stop", "length"):
            raise bad(f"finish_reason {finish!r}")
        self._check_label(url, meta.get("weight_version"), bad)
        pairs = meta.get("output_token_logprobs")
        if not isinstance(pairs, list):
            raise bad("meta_info.output_token_logprobs is missing (was return_logprob sent?)")
        ids: list[int] = []
        logprobs: list[float] = []
        for k, entry in enumerate(pairs):
            ok = isinstance(entry, list | tuple) and len(entry) >= 2
            lp, token = (entry[0], entry[1]) if ok else (None, None)
            if not (
                isinstance(lp, int | float)
                and math.isfinite(lp)
                and lp <= _LOGPROB_SLACK
                and isinstance(token, int)
                and not isinstance(token, bool)
            ):
                raise bad(f"output_token_logprobs[{k}] is {entry!r}, not [logprob <= 0, id, ...]")
            logprobs.append(min(float(lp), 0.0))  # float rounding can leave log(1) a hair above 0
            ids.append(token)
        if "output_ids" in item and item["output_ids"] != ids:
            raise bad(f"output_ids {item['output_ids']} differ from the logprob ids {ids}")
        if len(ids) > req.max_tokens:
            raise bad(f"{len(ids)} tokens, more than max_new_tokens={req.max_tokens}")
        seen = meta.get("prompt_tokens")
        if seen is not None and seen != n_prompt:  # e.g. a server run with --allow-auto-truncate
            raise bad(f"the server read {seen} prompt tokens of the {n_prompt} sent (truncated?)")
        cached = meta.get("cached_tokens")
        if isinstance(cached, int) and not isinstance(cached, bool) and 0 <= cached <= n_prompt:
            self.cached_tokens += cached
        text = item.get("text")
        if not isinstance(text, str):
            text = self._tokenizer.decode(ids, skip_special_tokens=True)
        return PolicyResponse(
            text=text, token_ids=ids, logprobs=logprobs, prompt_tokens=n_prompt, version=version
        )

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

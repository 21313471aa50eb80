"""The SGLang backend: a whole policy batch in one request to SGLang's native HTTP API.

Written against sglang 0.5.x. Every request and response shape below is SGLang's own; where each
comes from is cited next to the code that uses it:

- ``POST /generate`` takes ``GenerateReqInput`` (docs/basic_usage/sampling_params.md, "/generate
  Endpoint"; python/sglang/srt/managers/io_struct.py): ``input_ids`` as a list of lists makes a
  batch, ``sampling_params`` may be one dict per prompt, ``return_logprob`` asks for the logprob
  of every output token. A batch answers a JSON list, one ``{"text", "output_ids", "meta_info"}``
  per prompt, in order (python/sglang/srt/managers/tokenizer_manager.py, _handle_batch_output).
- ``meta_info`` holds ``finish_reason`` (``{"type": "stop"|"length"|"abort", ...}``),
  ``prompt_tokens``, ``weight_version`` and ``output_token_logprobs``: one ``[logprob, token_id,
  text-or-null]`` per output token (tokenizer_manager.py, detokenize_logprob_tokens). Those
  logprobs are of the distribution SGLang sampled from: logits divided by the temperature, with
  the grammar's vocabulary mask applied (python/sglang/srt/layers/sampler.py), unless the server
  runs with SGLANG_RETURN_ORIGINAL_LOGPROB.
- Sampling parameters (python/sglang/srt/sampling/sampling_params.py, SamplingParams):
  ``temperature``, ``max_new_tokens``, ``top_p``/``top_k``/``min_p`` and the penalties (sent
  explicitly, because a server started with the default ``--sampling-defaults model`` takes them
  from the model's generation_config.json and would sample from a truncated distribution the
  learner cannot recompute), one of ``regex``/``ebnf``/``json_schema``, and ``sampling_seed``, the
  per-request seed (added in September 2025, sglang PR #10678; it makes sampling reproducible when
  the server runs with ``--enable-deterministic-inference``, docs "Deterministic Inference").
- Weight sync (docs/advanced_features/sglang_for_rl.md, "Open-To-Use Refit Functionality" and
  "Easy To Postpone Generation"): ``POST /pause_generation`` ``{}``, ``POST
  /update_weights_from_disk`` ``{"model_path", "weight_version"}`` answering ``{"success",
  "message", "num_paused_requests"}`` (HTTP 400 when it failed), ``POST /continue_generation``
  ``{}``. "pause_generation, update weights, continue_generation is the correct execution flow".
- ``GET /health`` answers 200 once the server serves; ``GET /get_model_info`` names
  ``model_path`` and ``tokenizer_path`` (python/sglang/srt/entrypoints/http_server.py).
- The server starts with ``sglang serve --model-path M --host H --port P`` (the console script
  of sglang's python/pyproject.toml; ``python -m sglang.launch_server`` is the older entry point,
  still supported, used when no ``sglang`` script is on the PATH).

Failures: a connection refused or dropped, a timeout, HTTP 429 or 5xx are retried with
exponential backoff, a bounded number of times; generation is safe to repeat (nothing is
committed until a whole batch has parsed, and a seeded request samples the same tokens again).
Any other error status and any response that is not the documented shape raise
:class:`PolicyError` naming the server and the request (agent, turn): never a silently wrong
answer. A prompt the server aborted (``finish_reason.type == "abort"``, e.g. another client paused
generation) is sent again.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
import trio

from collective.actions import ActionSpace
from policy.base import PolicyError, PolicyRequest, PolicyResponse
from policy.constraint import action_ebnf, action_regex
from policy.hf_prompt import load_tokenizer, prompt_ids

Constraint = Literal["regex", "ebnf"]
_SEED_MASK = (1 << 63) - 1  # SGLang keeps seeds in int64 tensors
_MIN_TEMPERATURE = 1e-5  # SGLang treats lower temperatures as greedy decoding
_LOGPROB_SLACK = 1e-3  # a logprob above this is not rounding, it is a broken answer


@functools.lru_cache(maxsize=256)
def _constraint(space: ActionSpace, kind: Constraint) -> str:
    return action_regex(space) if kind == "regex" else action_ebnf(space)


def _who(requests: Sequence[PolicyRequest]) -> str:
    shown = ", ".join(f"agent {r.agent} turn {r.turn}" for r in requests[:3])
    more = f" and {len(requests) - 3} more" if len(requests) > 3 else ""
    return f"{len(requests)} request(s): {shown}{more}"


class _Transient(Exception):
    """A failure worth another try (the message says which)."""


class _Aborted(Exception):
    """The server aborted one prompt of a batch, e.g. because generation was paused."""


class SGLangPolicy:
    """A :class:`policy.base.Policy` served by an SGLang server at ``url``.

    ``tokenizer`` is the model's Hugging Face tokenizer (a local directory, or a loaded
    tokenizer); by default it is read from the directory the server reports in
    ``/get_model_info``, which works when the server runs on this machine. ``constraint`` picks
    how actions are constrained (a regex works with every SGLang grammar backend; EBNF needs
    XGrammar or llguidance). ``seeded`` sends each request's seed as ``sampling_seed`` (turn it off
    for a server older than that parameter). ``timeout`` bounds one HTTP call; ``attempts`` bounds
    the tries of one call, ``backoff`` is the first pause between them (doubling after each).

    Calls are serialised: :meth:`update_weights` waits for a batch in flight and no batch starts
    during an update, so the version on a response is the version of every one of its tokens. A
    server holds one version at a time, so a request pinned to another (``PolicyRequest.version``
    other than -1 and :attr:`version`) is refused with :class:`PolicyError`.
    From another thread (a learner), call ``trio.from_thread.run(policy.update_weights, ...)``.
    """

    def __init__(
        self,
        url: str,
        *,
        tokenizer: str | Path | Any | None = None,
        constraint: Constraint = "regex",
        version: int = 0,
        seeded: bool = True,
        timeout: float = 300.0,
        attempts: int = 4,
        backoff: float = 0.5,
        server: SGLangServer | None = None,
        name: str | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"SGLang server URL must start with http:// or https://, got {url!r}")
        if constraint not in ("regex", "ebnf"):
            raise ValueError(f"constraint must be 'regex' or 'ebnf', got {constraint!r}")
        if attempts < 1 or timeout <= 0 or backoff < 0:
            raise ValueError(
                "need attempts >= 1, timeout > 0, backoff >= 0; "
                f"got {attempts}, {timeout}, {backoff}"
            )
        self.url = url.rstrip("/")
        self.name = name or f"sglang:{self.url}"
        self.version = version
        self.constraint: Constraint = constraint
        self.seeded = seeded
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.server = server
        self._tokenizer_source = tokenizer
        self._tokenizer: Any = None
        self._label: str | None = None  # the weight_version we told the server, once we have
        self._lock = trio.Lock()

    # -- the Policy protocol ----------------------------------------------------------------------

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        if not requests:
            return []
        async with self._lock, self._client() as client:
            version = self.version
            pinned = [r for r in requests if r.version not in (-1, version)]
            if pinned:  # a server holds one set of weights: it cannot answer for another
                wanted = sorted({r.version for r in pinned})
                raise PolicyError(
                    f"SGLang server {self.url} holds policy version {version}, but "
                    f"{_who(pinned)} are pinned to version(s) {wanted}"
                )
            tokenizer = await self._ensure_tokenizer(client)
            prompts = [prompt_ids(tokenizer, r.prompt, r.space) for r in requests]
            answers: dict[int, PolicyResponse] = {}
            pending, why = list(range(len(requests))), ""
            for attempt in range(self.attempts):
                if attempt:
                    await trio.sleep(self.backoff * 2 ** (attempt - 1))
                batch = [requests[i] for i in pending]
                items = await self._call(
                    client,
                    "/generate",
                    self._generate_body(batch, [prompts[i] for i in pending]),
                    _who(batch),
                )
                if isinstance(items, dict) and len(batch) == 1:
                    items = [items]
                if not isinstance(items, list) or len(items) != len(batch):
                    got = len(items) if isinstance(items, list) else type(items).__name__
                    raise PolicyError(
                        f"SGLang server {self.url}: /generate answered {got} items for "
                        f"{_who(batch)}"
                    )
                aborted = []
                for i, item in zip(pending, items, strict=True):
                    try:
                        answers[i] = self._parse(
                            item, requests[i], len(prompts[i]), version, tokenizer
                        )
                    except _Aborted as e:
                        aborted.append(i)
                        why = str(e)
                pending = aborted
                if not pending:
                    return [answers[i] for i in range(len(requests))]
            raise PolicyError(
                f"SGLang server {self.url}: generation was aborted {self.attempts} times for "
                f"{_who([requests[i] for i in pending])} (last: {why})"
            )

    async def update_weights(self, path: str | Path, version: int) -> None:
        """Load the weights written at ``path`` (see :meth:`policy.hf.HFModel.save`) and record
        ``version``: every token sampled after this returns carries it.

        Generation is paused around the load; if the load fails, generation is resumed, the
        version is left as it was, and :class:`PolicyError` says why.
        """
        if version < 0:
            raise ValueError(f"weight version must be >= 0, got {version}")
        what = f"weights {str(path)!r} as version {version}"
        async with self._lock, self._client() as client:
            await self._call(client, "/pause_generation", {}, what)
            try:
                reply = await self._call(
                    client,
                    "/update_weights_from_disk",
                    {"model_path": str(path), "weight_version": str(version)},
                    what,
                )
                if not (isinstance(reply, dict) and reply.get("success") is True):
                    raise PolicyError(
                        f"SGLang server {self.url}: /update_weights_from_disk failed for {what}: "
                        f"{reply!r}"
                    )
                self.version = version
                self._label = str(version)
            finally:
                await self._call(client, "/continue_generation", {}, what)

    async def aclose(self) -> None:
        if self.server is not None:
            await trio.to_thread.run_sync(self.server.stop)

    # -- HTTP -------------------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        # A client per call: a connection pool belongs to one event loop, and a policy outlives
        # many trio.run calls (one per episode batch or fork). One TCP connect per GPU batch is
        # nothing next to the batch.
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout, connect=min(10.0, self.timeout))
        )

    async def _call(
        self, client: httpx.AsyncClient, path: str, body: dict[str, Any] | None, what: str
    ) -> Any:
        """One call with bounded retries of transient failures; the decoded JSON answer."""
        failures: list[str] = []
        for attempt in range(self.attempts):
            if attempt:
                await trio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                return await self._once(client, path, body, what)
            except _Transient as e:
                failures.append(str(e))
        raise PolicyError(
            f"SGLang server {self.url}: {path} for {what} failed {self.attempts} times "
            f"(last: {failures[-1]})"
        )

    async def _once(
        self, client: httpx.AsyncClient, path: str, body: dict[str, Any] | None, what: str
    ) -> Any:
        try:
            if body is None:
                r = await client.get(self.url + path)
            else:
                r = await client.post(self.url + path, json=body)
        except httpx.TimeoutException as e:
            raise _Transient(f"timed out after {self.timeout:g}s ({type(e).__name__})") from e
        except httpx.TransportError as e:  # refused, reset, dropped mid-answer
            raise _Transient(f"{type(e).__name__}: {e}") from e
        if r.status_code == 429 or r.status_code >= 500:
            raise _Transient(f"HTTP {r.status_code}: {r.text[:300]}")
        if r.status_code >= 400:
            raise PolicyError(
                f"SGLang server {self.url}: {path} for {what} was refused with HTTP "
                f"{r.status_code}: {r.text[:500]}"
            )
        try:
            return r.json()
        except ValueError:
            raise PolicyError(
                f"SGLang server {self.url}: {path} for {what} answered something that is not "
                f"JSON: {r.text[:200]!r}"
            ) from None

    async def _ensure_tokenizer(self, client: httpx.AsyncClient) -> Any:
        if self._tokenizer is not None:
            return self._tokenizer
        source = self._tokenizer_source
        if source is None:
            info = await self._call(client, "/get_model_info", None, "the model's tokenizer")
            source = isinstance(info, dict) and (
                info.get("tokenizer_path") or info.get("model_path")
            )
            if not source or not Path(source).is_dir():
                raise PolicyError(
                    f"SGLang server {self.url} serves {source!r}, which is not a directory on "
                    "this machine; give SGLangPolicy(tokenizer=PATH) the model's tokenizer"
                )
        self._tokenizer = load_tokenizer(source) if isinstance(source, str | Path) else source
        return self._tokenizer

    # -- the protocol's shapes --------------------------------------------------------------------

    def _generate_body(
        self, batch: Sequence[PolicyRequest], prompts: Sequence[list[int]]
    ) -> dict[str, Any]:
        params = []
        for r in batch:
            if r.temperature < _MIN_TEMPERATURE:
                raise PolicyError(
                    f"SGLang server {self.url}: agent {r.agent} turn {r.turn} asks temperature "
                    f"{r.temperature}; below {_MIN_TEMPERATURE} SGLang samples greedily and its "
                    "logprobs are not the sampling distribution's"
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
            params.append(p)
        return {"input_ids": list(prompts), "sampling_params": params, "return_logprob": True}

    def _parse(
        self, item: Any, req: PolicyRequest, n_prompt: int, version: int, tokenizer: Any
    ) -> PolicyResponse:
        """One answer as a response; :class:`_Aborted` when the server aborted it for a reason
        that may pass (a pause), a :class:`PolicyError` for any other answer."""

        def bad(why: str) -> PolicyError:
            return PolicyError(
                f"SGLang server {self.url}: malformed /generate answer for agent {req.agent} "
                f"turn {req.turn}: {why}"
            )

        meta = item.get("meta_info") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            raise bad(f"no meta_info in {str(item)[:200]}")
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else None
        if kind == "abort":
            status = finish.get("status_code")
            if isinstance(status, int) and 400 <= status < 500 and status != 429:
                raise bad(f"the server refused it: {finish.get('message')!r}")
            raise _Aborted(str(finish.get("message", "aborted")))
        if kind not in ("stop", "length"):
            raise bad(f"finish_reason {finish!r}")
        label = meta.get("weight_version")
        if self._label is not None and label is not None and str(label) != self._label:
            raise bad(
                f"the server reports weight version {label!r} but this client loaded "
                f"{self._label!r} (did another client update the weights?)"
            )
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
        text = item.get("text")
        if not isinstance(text, str):
            text = tokenizer.decode(ids, skip_special_tokens=True)
        return PolicyResponse(
            text=text, token_ids=ids, logprobs=logprobs, prompt_tokens=n_prompt, version=version
        )


# -- a server of our own ------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def sglang_command() -> list[str]:
    """How to start SGLang here: ``sglang serve`` if its script is installed, else the module."""
    exe = shutil.which("sglang") or shutil.which("sglang", path=str(Path(sys.executable).parent))
    if exe:
        return [exe, "serve"]
    if importlib.util.find_spec("sglang") is None:
        raise PolicyError(
            "cannot launch SGLang: it is not installed (pip install 'collective[sglang]', on a "
            "machine with a CUDA GPU), and there is no `sglang` command on the PATH"
        )
    return [sys.executable, "-m", "sglang.launch_server"]


def _stop_group(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """Stop the process group we started (SGLang runs its scheduler and detokenizer as children)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class SGLangServer:
    """An SGLang server process this program started on a free loopback port.

    :meth:`launch` returns once ``/health`` answers 200; :meth:`stop` ends the server's whole
    process group. Its output goes to :attr:`log`, a temporary file kept only when it failed.
    The process is also stopped when this object is collected or the interpreter exits, so a
    crashed run leaves no server holding a GPU.
    """

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log
        self._finalizer = weakref.finalize(self, _stop_group, proc, 5.0)

    @classmethod
    def launch(
        cls,
        model: str | Path,
        *,
        args: Sequence[str] = (),
        command: Sequence[str] | None = None,
        timeout: float = 900.0,
        host: str = "127.0.0.1",
    ) -> SGLangServer:
        """Start ``sglang serve --model-path MODEL --host HOST --port PORT ARGS`` and wait until it
        is healthy (at most ``timeout`` seconds: loading a large model takes minutes).
        ``command`` replaces ``sglang serve`` (tests start a stand-in this way)."""
        port = free_port(host)
        argv = [*(command or sglang_command()), "--model-path", str(model)]
        argv += ["--host", host, "--port", str(port), *args]
        fd, log_name = tempfile.mkstemp(prefix="sglang-", suffix=".log")
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        server = cls(proc, f"http://{host}:{port}", Path(log_name))
        try:
            server.wait_healthy(timeout)
        except BaseException:
            server.stop(keep_log=True)  # the error names the log
            raise
        return server

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise PolicyError(
                        f"SGLang server {self.url} exited with code {code} before it was "
                        f"healthy; the end of its log ({self.log}):\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.TransportError):
                    if client.get(self.url + "/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise PolicyError(
                        f"SGLang server {self.url} was not healthy after {timeout:g}s; the end of "
                        f"its log ({self.log}):\n{self.log_tail()}"
                    )
                time.sleep(0.25)

    def stop(self, *, keep_log: bool = False) -> None:
        _stop_group(self.proc)
        self._finalizer.detach()
        if not keep_log:
            self.log.unlink(missing_ok=True)

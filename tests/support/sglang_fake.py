"""A stand-in for an SGLang server, as strict as the real one in everything this project's client
does: SGLang needs a CUDA GPU, and this machine has none.

It stands in for the native HTTP server of sglang >= 0.5.3 (sgl-project/sglang:
python/sglang/srt/entrypoints/http_server.py and the TokenizerManager behind it,
python/sglang/srt/managers/tokenizer_manager.py). Where the real server refuses, so does this one,
with the real status and body:

- ``POST /generate`` with a batch of ``input_ids`` and one ``sampling_params`` dict per prompt (or
  one for all) answers a list of ``{"text", "output_ids", "meta_info"}``; ``meta_info`` holds
  ``finish_reason``, ``prompt_tokens``, ``completion_tokens``, ``weight_version`` and, when
  ``return_logprob`` is true, ``output_token_logprobs`` as ``[logprob, token_id, null]`` triples.
- A sampling key SamplingParams does not have is a TypeError there
  (python/sglang/srt/sampling/sampling_params.py), which the /generate handler does not catch (it
  catches ValueError): HTTP 500 ``Internal Server Error``. A value out of range, or more than one
  of ``regex``/``json_schema``/``ebnf``, is a ValueError from ``SamplingParams.verify``: HTTP 400
  ``{"error": {"message": ...}}``.
- ``sampling_seed`` is honoured only by a server started with ``--enable-deterministic-inference``
  (python/sglang/srt/sampling/sampling_batch_info.py builds the seed tensor only then, with 42 for
  a request that has none). Any other server accepts the key and ignores it: here each of its
  answers draws from fresh randomness.
- Aborts (tokenizer_manager.py, _wait_one_response and _handle_abort_req): a prompt aborted with
  ``status_code`` 400 (an invalid grammar) fails the whole request with HTTP 400, one aborted
  with 500 or 503 fails it with that status; a plain abort (a pause in ``abort`` mode, another
  client's /abort_request) is answered as its item, ``finish_reason`` ``{"type": "abort",
  "message": "Abort before prefill"}`` with ``prompt_tokens`` 0, in an HTTP 200 answer.
- ``GET /health`` answers 503 while the server starts (``ServerStatus.Starting``), then 200; it
  is the one path an ``--api-key`` server serves without ``Authorization: Bearer KEY``, every
  other answers 401 ``{"error": "Unauthorized"}`` (python/sglang/srt/utils,
  add_api_key_middleware).
- ``POST /pause_generation`` takes ``{"mode": "abort"|"retract"|"in_place"}``, ``abort`` by
  default (io_struct.py, PauseGenerationReqInput; another mode is a 400). While paused, new
  /generate requests wait for ``/continue_generation`` (generate_request waits on
  ``is_pause_cond``); in ``abort`` mode the requests in flight are aborted and the pause answers
  once none is left; in the other modes they are held and finish after the continue.
- ``POST /update_weights_from_disk`` ``{"model_path", "weight_version"}`` waits for requests in
  flight (the real one takes the model-update lock as writer), answers HTTP 400 with ``"success":
  false`` when the directory holds no model (no config.json), and records the weight version.
- Weights without the disk (io_struct.py): ``POST /init_weights_update_group`` joins a real
  torch.distributed gloo group at ``master_address:master_port`` as rank ``rank_offset`` of
  ``world_size`` (the store laid out as SGLang's init_custom_process_group and torch's helper
  lay it out); ``/update_weights_from_distributed`` with ``load_format: "flattened_bucket"``
  receives the bucket's bytes by broadcast from rank 0 and cuts them up by ``names``/``dtypes``/
  ``shapes``; ``/update_weights_from_tensor`` decodes its ``serialized_named_tensors`` entry
  (one per TP rank). Each checks what it gets against the weights it holds (read from the model
  directory's safetensors; a name it lacks, another dtype or shape is a refusal, as load_weights
  fails there), answers ``{"success": false, "message"}`` (HTTP 400) when it refuses, and holds
  what it got, bit for bit (:attr:`FakeSGLang.weights`). Stricter than SGLang: every weight call
  must be a JSON object of known fields that sets ``abort_all_requests`` and ``weight_version``
  explicitly. :attr:`FakeSGLang.weight_faults` scripts them: ``"refuse"``, ``"hang"`` (answer
  after :attr:`FakeSGLang.hang` seconds, receiving nothing), ``"wrong-world"`` (join the group
  counting one rank more: it never forms). What the tensor route cannot stand in for is CUDA IPC:
  CPU tensors travel as shared memory within this one process.
- ``GET /model_info`` and ``/server_info`` (``/get_model_info`` and ``/get_server_info`` are the
  names they had before, still served as aliases); ``legacy=True`` stands in for a server of the
  0.5.3 era, which has only the old names (the new ones are 404) and ignores the pause body.
  /server_info reports the flags the server was started with (``enable_deterministic_inference``,
  ``dp_size``, ``tp_size``, ``mem_fraction_static``, ``attention_backend``) and ``version``.

What it cannot be is a model. It "decodes" a prompt by drawing a random string from the request's
``regex`` (seeded by ``sampling_seed`` when it is deterministic), so it honours the constraint the
way a constrained decoder does; it tokenises that string with the model's real tokenizer and
appends EOS; its logprobs are stand-in numbers (a fixed function of the token id), not a model's.
Requests without a regex get the fixed answer :attr:`FakeSGLang.ebnf_text` (it parses no EBNF).

Faults are scripted per ``/generate`` call through :attr:`FakeSGLang.faults`: ``"500"``/``"503"``
(an error status), ``"400"``, ``"malformed"`` (a body that is not JSON), ``"bad-shape"`` (JSON
without ``meta_info``), ``"positive-logprob"``, ``"ids-mismatch"`` (``output_ids`` that disagree
with the logprobs), ``"unfinished"`` (``finish_reason`` null), ``"short-batch"`` (one answer too
few), ``"truncated-prompt"``, ``"drop"`` (close the connection without answering), ``"hang"``
(answer after :attr:`FakeSGLang.hang` seconds), ``"abort-first"`` (the first prompt is aborted as
by another client), ``"refuse-first"`` (the first prompt is aborted with status 400, as for a
grammar the server rejects) and ``"unavailable-first"`` (aborted with status 503).

In-process: ``FakeSGLang(model_dir, deterministic=True).start()``; as a process (what
``SGLangServer.launch`` starts in place of ``sglang serve`` in the tests): ``python
tests/support/sglang_fake.py --model-path DIR --host 127.0.0.1 --port P`` plus the real flags it
knows (``--enable-deterministic-inference``, ``--api-key``, ``--dp-size``, ``--tp-size``,
``--mem-fraction-static``, ``--attention-backend``) and its own (``--fake-startup SECONDS``,
``--fake-decode-delay SECONDS``, ``--fake-legacy``). Any other flag exits with code 2, as the
real argument parser does. Each /generate prints one line (``generate N prompts``) to stdout, so
a test can see a request arrive. It only ever binds loopback addresses.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re._constants as sre_c
import re._parser as sre_parse
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# Characters a negated class ([^"\n]) is drawn from: enough to exercise quoting and spacing.
ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,:;!?'-_()#/+*=\t"
# The keyword arguments of SamplingParams (sampling_params.py); anything else is a TypeError.
SAMPLING_KEYS = frozenset(
    [
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
    ]
)
PAUSE_MODES = ("abort", "retract", "in_place")
# The fields of the weight-update requests (io_struct.py), those this project's client may send.
_COMMON = ("flush_cache", "abort_all_requests", "weight_version", "load_format")
DISK_KEYS = frozenset(["model_path", *_COMMON])
DISTRIBUTED_KEYS = frozenset(["names", "dtypes", "shapes", "group_name", *_COMMON])
TENSOR_KEYS = frozenset(["serialized_named_tensors", *_COMMON])
GROUP_KEYS = frozenset(
    ["master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"]
)
UNSEEDED_SEED = 42  # what a deterministic server samples a request without sampling_seed with


def sample_regex(pattern: str, rng: random.Random) -> str:
    """A random full match of ``pattern`` (the subset of regex the action constraints use)."""
    return _walk(sre_parse.parse(pattern), rng)


def _walk(sub: Any, rng: random.Random) -> str:
    out = []
    for op, av in sub:
        if op is sre_c.LITERAL:
            out.append(chr(av))
        elif op is sre_c.IN:
            out.append(_pick(av, rng))
        elif op is sre_c.BRANCH:
            out.append(_walk(rng.choice(av[1]), rng))
        elif op is sre_c.SUBPATTERN:
            out.append(_walk(av[3], rng))
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, item = av
            out += [_walk(item, rng) for _ in range(rng.randint(lo, min(hi, lo + 12)))]
        else:
            raise ValueError(f"the fake server does not model regex feature {op}")
    return "".join(out)


def _pick(items: Any, rng: random.Random) -> str:
    def member(c: str) -> bool:
        for op, av in items:
            if op is sre_c.LITERAL and ord(c) == av:
                return True
            if op is sre_c.RANGE and av[0] <= ord(c) <= av[1]:
                return True
        return False

    if items and items[0][0] is sre_c.NEGATE:
        return rng.choice([c for c in ALPHABET if not member(c)])
    pool = [c for op, av in items if op is sre_c.RANGE for c in map(chr, range(av[0], av[1] + 1))]
    pool += [chr(av) for op, av in items if op is sre_c.LITERAL]
    return rng.choice(pool)


def verify(p: dict[str, Any]) -> str | None:
    """What ``SamplingParams.verify`` would refuse in ``p`` (a ValueError there), or None."""
    temperature, top_p = p.get("temperature", 1.0), p.get("top_p", 1.0)
    top_k, min_p = p.get("top_k", -1), p.get("min_p", 0.0)
    if temperature < 0:
        return f"temperature must be non-negative, got {temperature}."
    if not 0.0 < top_p <= 1.0:
        return f"top_p must be in (0, 1], got {top_p}."
    if not 0.0 <= min_p <= 1.0:
        return f"min_p must be in [0, 1], got {min_p}."
    if top_k < 1 and top_k != -1:
        return f"top_k must be -1 (disable), or at least 1, got {top_k}."
    for key in ("frequency_penalty", "presence_penalty"):
        if not -2.0 <= p.get(key, 0.0) <= 2.0:
            return f"{key} must be in [-2, 2], got {p[key]}."
    if not 0.0 <= p.get("repetition_penalty", 1.0) <= 2.0:
        return f"repetition_penalty must be in [0, 2], got {p['repetition_penalty']}."
    if p.get("max_new_tokens", 128) is not None and p.get("max_new_tokens", 128) < 0:
        return f"max_new_tokens must be at least 0, got {p['max_new_tokens']}."
    if sum(p.get(key) is not None for key in ("regex", "json_schema", "ebnf")) > 1:
        return "Only one of regex, json_schema, or ebnf can be set."
    return None


class FastTokenizer:
    """The model's tokenizer read with the ``tokenizers`` library, which is what a Hugging Face
    fast tokenizer runs underneath: a process that imports no transformers starts in a fraction
    of a second."""

    def __init__(self, model_path: str) -> None:
        from tokenizers import Tokenizer

        directory = Path(model_path)
        self.backend = Tokenizer.from_file(str(directory / "tokenizer.json"))
        eos = json.loads((directory / "tokenizer_config.json").read_text())["eos_token"]
        eos = eos if isinstance(eos, str) else eos["content"]
        self.eos_token_id = self.backend.token_to_id(eos)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=True)


class RadixCache:
    """What SGLang's radix cache reports as ``meta_info.cached_tokens``: the length of the
    longest head a prompt shares with any prompt this server prefilled before (a trie of token
    ids that is never evicted: the fake's memory is the test's few hundred prompts)."""

    def __init__(self) -> None:
        self.root: dict[int, dict] = {}
        self.hits = 0  # prompt tokens served from the cache
        self.tokens = 0  # prompt tokens seen
        self._lock = threading.Lock()  # (the server answers each request in its own thread)

    def insert(self, prompt: Sequence[int]) -> int:
        with self._lock:
            node, cached = self.root, 0
            for token in prompt:
                if token in node:
                    cached += 1
                node = node.setdefault(token, {})
            self.hits += cached
            self.tokens += len(prompt)
            return cached


class FakeSGLang:
    """The stand-in server; see the module docstring. Every POST is appended to :attr:`log` as
    ``(path, body)``. ``deterministic`` stands for ``--enable-deterministic-inference``,
    ``startup`` for the seconds /health answers 503, ``decode_delay`` for the seconds one
    /generate takes, ``server_args`` for the other flags /server_info reports."""

    def __init__(
        self,
        model_path: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        deterministic: bool = False,
        api_key: str | None = None,
        startup: float = 0.0,
        decode_delay: float = 0.0,
        legacy: bool = False,
        version: str = "0.5.3",
        server_args: dict[str, Any] | None = None,
    ) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the fake server binds loopback only, not {host!r}")
        self.model_path = str(model_path)
        self.tokenizer = FastTokenizer(self.model_path)
        self.deterministic = deterministic
        self.api_key = api_key
        self.decode_delay = decode_delay
        self.legacy = legacy
        self.version = version
        self.server_args = {"dp_size": 1, "tp_size": 1, **(server_args or {})}
        self.weight_version = "default"  # ServerArgs.weight_version's default
        self.records_version = True  # False: a server that ignores weight_version when it loads
        self.weight_faults: list[str] = []  # scripted per weight-update call (module docstring)
        self.group_timeout = 10.0  # how long joining a group and one broadcast may take here
        self.groups: dict[str, Any] = {}  # group_name -> (process group, world_size, rank)
        self._weights: dict[str, Any] | None = None  # name -> tensor, read on first use
        # weight_version -> a copy of the tensors held once that version was loaded (any route);
        # keep_held False skips the copy (bench/weight_sync.py: a copy no real server makes)
        self.held: dict[str, dict[str, Any]] = {}
        self.keep_held = True
        self.log: list[tuple[str, Any]] = []
        self.faults: list[str] = []
        self.hang = 1.0
        self.ebnf_text = "wait 1"
        self.announce = False  # print a line per /generate (the process does, for its log)
        self._ready_at = time.monotonic() + startup
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._paused: str | None = None  # the pause mode, while paused
        self._aborts = 0  # bumped by every pause in abort mode
        self._in_flight = 0
        self.radix = RadixCache()  # SGLang's prefix cache, as far as it reports cached_tokens
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self  # type: ignore[attr-defined]

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def paused(self) -> bool:
        return self._paused is not None

    def start(self) -> FakeSGLang:
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        """Close the listening socket: a server gone, new connections refused (one a client
        keeps open is served until the client closes it; this project's client opens new ones
        for every batch)."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def posts(self, path: str) -> list[Any]:
        return [body for p, body in self.log if p == path]

    # -- endpoints ------------------------------------------------------------------------------

    def authorised(self, path: str, header: str | None) -> bool:
        return not self.api_key or path.startswith("/health") or header == f"Bearer {self.api_key}"

    def get(self, path: str) -> tuple[int, Any]:
        if path in ("/health", "/health_generate"):
            return (200, b"") if time.monotonic() >= self._ready_at else (503, b"")
        renamed = {"/model_info": "/get_model_info", "/server_info": "/get_server_info"}
        if self.legacy and path in renamed:
            return 404, {"detail": "Not Found"}
        if path in ("/model_info", "/get_model_info"):
            return 200, {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
            }
        if path in ("/server_info", "/get_server_info"):
            return 200, {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "enable_deterministic_inference": self.deterministic,
                "weight_version": self.weight_version,
                **self.server_args,
                "version": self.version,
            }
        return 404, {"detail": "Not Found"}

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        self.log.append((path, body))
        if path == "/generate":
            return self.generate(body)
        if path == "/pause_generation":
            return self.pause("abort" if self.legacy else body.get("mode", "abort"))
        if path == "/continue_generation":
            with self._cond:
                self._paused = None
                self._cond.notify_all()
            return 200, {"message": "Generation continued successfully.", "status": "ok"}
        if path == "/update_weights_from_disk":
            return self.update_weights(body)
        if path == "/init_weights_update_group":
            return self.init_group(body)
        if path == "/update_weights_from_distributed":
            return self.update_from_distributed(body)
        if path == "/update_weights_from_tensor":
            return self.update_from_tensor(body)
        if path == "/destroy_weights_update_group":
            return self.destroy_group(body)
        return 404, {"detail": "Not Found"}

    def pause(self, mode: Any) -> tuple[int, Any]:
        if mode not in PAUSE_MODES:
            why = f"Invalid mode: {mode!r}. Expected one of {list(PAUSE_MODES)}."
            return 400, {"error": {"message": why}}
        with self._cond:
            self._paused = mode
            if mode == "abort":
                self._aborts += 1
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._in_flight == 0, timeout=30)
        return 200, {"message": "Generation paused successfully.", "status": "ok"}

    def update_weights(self, body: dict[str, Any]) -> tuple[int, Any]:
        refused = self.control(body, DISK_KEYS)
        if refused:
            return refused
        with self._cond:  # the model-update lock: wait for the requests in flight
            self._cond.wait_for(lambda: self._in_flight == 0, timeout=30)
            model_path = body.get("model_path")
            if not model_path or not (Path(model_path) / "config.json").is_file():
                return 400, {
                    "success": False,
                    "message": f"Failed to get weights iterator: {model_path}",
                    "num_paused_requests": 0,
                }
            if any(Path(model_path).glob("*.safetensors")):  # a real checkpoint: held from now
                loaded = read_safetensors(model_path)
                why = self.mismatch(list(loaded.items())) if self.weights else None
                if why:
                    return 400, {"success": False, "message": why, "num_paused_requests": 0}
                self.weights.update(loaded)
            message = "Succeeded to update model weights."
            if body.get("weight_version") is not None and self.records_version:
                self.weight_version = str(body["weight_version"])
                message += f" Weight version updated to {self.weight_version}."
                self._keep()
        return 200, {"success": True, "message": message, "num_paused_requests": 0}

    # -- weights without the disk ---------------------------------------------------------------

    @property
    def weights(self) -> dict[str, Any]:
        """The tensors this server holds, by checkpoint name (read from the model directory's
        safetensors on first use; empty when it has none)."""
        if self._weights is None:
            self._weights = read_safetensors(self.model_path)
        return self._weights

    def control(self, body: Any, keys: frozenset[str]) -> tuple[int, Any] | None:
        """The client's contract on a weight-update call: a JSON object of known keys that sets
        ``abort_all_requests`` (a bool) and ``weight_version`` explicitly."""
        if not isinstance(body, dict):
            return self.refusal("the body is not a JSON object")
        unknown = set(body) - keys
        if unknown:
            return self.refusal(f"unknown field(s) {sorted(unknown)}")
        if not isinstance(body.get("abort_all_requests"), bool):
            return self.refusal("abort_all_requests is not set explicitly")
        if "weight_version" not in body:
            return self.refusal("weight_version is not set explicitly")
        fault = self.weight_faults.pop(0) if self.weight_faults else None
        if fault == "refuse":
            return self.refusal("stand-in refusal of this weight update")
        if fault == "hang":
            time.sleep(self.hang)
        return None

    @staticmethod
    def refusal(message: str) -> tuple[int, Any]:
        return 400, {"success": False, "message": message}

    def holds(self, named: Sequence[tuple[str, Any]]) -> bool:
        """This server holds exactly these tensors, by name, bit for bit (and no others)."""
        import torch

        held = self.weights
        return set(held) == {n for n, _ in named} and all(
            held[n].dtype == t.dtype
            and torch.equal(held[n].view(torch.uint8), t.contiguous().view(torch.uint8))
            for n, t in named
        )

    def mismatch(self, named: Sequence[tuple[str, Any]]) -> str | None:
        """Why the server's model cannot take these tensors (names it does not have, another
        dtype or shape), or None."""
        held = self.weights
        if not held:
            return f"this stand-in's model directory {self.model_path} holds no weights"
        for name, tensor in named:
            if name not in held:
                return f"the model has no parameter named {name!r}"
            if tensor.dtype != held[name].dtype or tuple(tensor.shape) != tuple(held[name].shape):
                return (
                    f"parameter {name!r} is {held[name].dtype} {tuple(held[name].shape)} here, "
                    f"got {tensor.dtype} {tuple(tensor.shape)}"
                )
        return None

    def init_group(self, body: Any) -> tuple[int, Any]:
        """Join the group as SGLang does (the c10d TCP rendezvous at master_address:master_port,
        the store prefixed by the group name, then by ``group_name/`` and ``cpu/`` as torch's
        process-group helper does for gloo), with this server's one rank."""
        import datetime

        import torch.distributed as dist

        if not isinstance(body, dict) or set(body) - GROUP_KEYS:
            return self.refusal(f"a bad init_weights_update_group body: {body!r}"[:300])
        name, world, offset = (
            body.get("group_name"),
            body.get("world_size"),
            body.get("rank_offset"),
        )
        if body.get("backend") != "gloo":
            return self.refusal(
                f"this stand-in joins gloo groups only, not {body.get('backend')!r}"
            )
        if not (isinstance(world, int) and isinstance(offset, int) and 1 <= offset < world):
            return self.refusal(f"rank_offset {offset!r} does not fit world_size {world!r}")
        if name in self.groups:
            return self.refusal(f"group {name!r} exists already")
        fault = self.weight_faults.pop(0) if self.weight_faults else None
        if fault == "refuse":
            return self.refusal("stand-in refusal to join the group")
        if fault == "wrong-world":  # a server that counts the ranks otherwise: never forms
            world += 1
        wait = datetime.timedelta(seconds=self.group_timeout)
        try:
            tcp = dist.TCPStore(
                body["master_address"], body["master_port"], world, False, timeout=wait
            )
            store = dist.PrefixStore(f"{name}/", dist.PrefixStore(name, tcp))
            pg = dist.ProcessGroupGloo(dist.PrefixStore("cpu/", store), offset, world, wait)
        except Exception as e:  # what SGLang answers when init_custom_process_group fails
            return self.refusal(f"Failed to init process group: {e}".splitlines()[0][:300])
        self.groups[name] = (pg, world, offset, tcp)
        return 200, {"success": True, "message": "Succeeded to initialize custom process group."}

    def destroy_group(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or body.get("group_name") not in self.groups:
            return self.refusal(f"no group {body!r}"[:300])
        del self.groups[body["group_name"]]
        return 200, {"success": True, "message": "Succeeded to destroy custom process group."}

    def update_from_distributed(self, body: Any) -> tuple[int, Any]:
        import datetime

        import torch
        import torch.distributed as dist

        from policy.sglang.weights import bucket_bytes, unflatten

        refused = self.control(body, DISTRIBUTED_KEYS)
        if refused:
            return refused
        group = self.groups.get(body.get("group_name"))
        if group is None:
            return self.refusal(f"Group {body.get('group_name')!r} not in {list(self.groups)}")
        if body.get("load_format") != "flattened_bucket":
            return self.refusal("this stand-in receives flattened buckets only")
        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        try:
            assert isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)
            assert len(names) == len(dtypes) == len(shapes) > 0
            size = bucket_bytes(dtypes, shapes)
        except (AssertionError, ValueError, TypeError) as e:
            return self.refusal(f"bad names/dtypes/shapes: {e}")
        flat = torch.empty(size, dtype=torch.uint8)
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = datetime.timedelta(seconds=self.group_timeout)
        try:
            group[0].broadcast([flat], options).wait()
        except RuntimeError as e:
            return self.refusal(f"Failed to update parameter online: {e}".splitlines()[0][:300])
        return self.hold(unflatten(flat, names, dtypes, shapes), body)

    def update_from_tensor(self, body: Any) -> tuple[int, Any]:
        from policy.sglang.weights import deserialize_named_tensors

        refused = self.control(body, TENSOR_KEYS)
        if refused:
            return refused
        entries = body.get("serialized_named_tensors")
        tp = int(self.server_args.get("tp_size") or 1)
        if not (isinstance(entries, list) and len(entries) == tp):
            return self.refusal(f"serialized_named_tensors needs one entry per TP rank ({tp})")
        if body.get("load_format") is not None:
            return self.refusal("this stand-in takes lists of named tensors only")
        try:
            named = deserialize_named_tensors(entries[0])
        except Exception as e:
            return self.refusal(f"cannot deserialize the tensors: {e}"[:300])
        return self.hold([(n, t.clone()) for n, t in named], body)

    def hold(self, named: list[tuple[str, Any]], body: dict[str, Any]) -> tuple[int, Any]:
        """Load tensors received (SGLang's load_weights: a name it lacks or a shape that does
        not fit fails it)."""
        why = self.mismatch(named)
        if why:
            return self.refusal(f"Failed to update parameter online: {why}")
        self.weights.update(named)
        if body.get("weight_version") is not None and self.records_version:
            self.weight_version = str(body["weight_version"])
            self._keep()
        return 200, {"success": True, "message": "Succeeded to update parameter online."}

    def _keep(self) -> None:
        """Remember what this version holds (:attr:`held`): a test can then check that each
        version a server loaded is the learner's weights of that version, whatever the route."""
        if self.weights and self.keep_held:
            self.held[self.weight_version] = {n: t.clone() for n, t in self.weights.items()}

    def generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        fault = self.faults.pop(0) if self.faults else None
        if self.announce:
            print(f"generate {len(body.get('input_ids') or [])} prompts", flush=True)
        with self._cond:  # a paused server holds new requests until it continues
            self._cond.wait_for(lambda: self._paused is None)
            self._in_flight += 1
            aborts = self._aborts
        try:
            refused = self.refuse(body, fault)
            if refused is not None:
                return refused
            aborted = self.decoding(aborts)
            return self.answer(body, fault, aborted)
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def refuse(self, body: dict[str, Any], fault: str | None) -> tuple[int, Any] | None:
        """The refusals of the real server, in its order; None when the request is fine."""
        if fault in ("500", "503"):
            return int(fault), {"error": {"message": "stand-in server failure"}}
        if fault == "400":
            return 400, {"error": {"message": "stand-in bad request"}}
        if fault == "malformed":
            return 200, b'{"text": "add 1", "meta_info": '
        if fault == "hang":
            time.sleep(self.hang)
        prompts, params = body.get("input_ids"), body.get("sampling_params")
        if isinstance(params, dict):
            params = [params] * len(prompts) if isinstance(prompts, list) else None
        if not (
            isinstance(prompts, list)
            and all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompts)
            and isinstance(params, list)
            and len(params) == len(prompts)
            and all(isinstance(p, dict) for p in params)
        ):
            return 400, {"error": {"message": "input_ids must be a batch, one params dict each"}}
        for p in params:
            if set(p) - SAMPLING_KEYS:  # a TypeError the handler does not catch
                return 500, b"Internal Server Error"
            try:
                why = verify(p)
            except TypeError:  # a value of the wrong type: uncaught there too
                return 500, b"Internal Server Error"
            if why is not None:
                return 400, {"error": {"message": why}}
        if fault == "refuse-first":
            return 400, {"error": {"message": "Invalid grammar request: stand-in"}}
        if fault == "unavailable-first":
            return 503, {
                "object": "error",
                "message": "stand-in: the scheduler is overloaded",
                "type": "Service Unavailable",
                "param": None,
                "code": 503,
            }
        body["sampling_params"] = params
        return None

    def decoding(self, aborts: int) -> bool:
        """Spend the decode time; True when a pause in abort mode aborted the request."""
        done_at = time.monotonic() + self.decode_delay
        with self._cond:
            while True:
                if self._aborts != aborts:
                    return True
                left = done_at - time.monotonic()
                if left <= 0 and self._paused is None:
                    return False
                self._cond.wait(timeout=max(left, 0.05) if self._paused is None else 0.05)

    def answer(self, body: dict[str, Any], fault: str | None, aborted: bool) -> tuple[int, Any]:
        prompts, params = body["input_ids"], body["sampling_params"]
        logprobs = body.get("return_logprob") is True
        out = [
            self.abort_item()
            if aborted or (fault == "abort-first" and k == 0)
            else self.decode(prompt, p, logprobs)
            for k, (prompt, p) in enumerate(zip(prompts, params, strict=True))
        ]
        if fault == "bad-shape":
            out = [{"text": "add 1"} for _ in prompts]
        if fault == "positive-logprob":
            out[0]["meta_info"]["output_token_logprobs"][0][0] = 0.5
        if fault == "ids-mismatch":
            out[0]["output_ids"] = out[0]["output_ids"][:-1]
        if fault == "unfinished":
            out[0]["meta_info"]["finish_reason"] = None
        if fault == "short-batch":
            out = out[:-1]
        if fault == "truncated-prompt":  # as a server run with --allow-auto-truncate answers
            out[0]["meta_info"]["prompt_tokens"] -= 3
        return 200, out

    def abort_item(self) -> dict[str, Any]:
        return {
            "text": "",
            "output_ids": [],
            "meta_info": {
                "id": f"fake-{next(self._ids)}",
                "finish_reason": {"type": "abort", "message": "Abort before prefill"},
                "prompt_tokens": 0,
                "completion_tokens": 0,
            },
        }

    def decode(self, prompt: list[int], p: dict[str, Any], logprobs: bool) -> dict[str, Any]:
        if self.deterministic:
            seed = p.get("sampling_seed")
            rng = random.Random(UNSEEDED_SEED if seed is None else seed)
        else:  # sampling_seed is accepted and ignored
            rng = random.Random()
        text = sample_regex(p["regex"], rng) if p.get("regex") else self.ebnf_text
        eos = self.tokenizer.eos_token_id
        ids = [*self.tokenizer.encode(text), eos]
        limit = p.get("max_new_tokens", 128)
        finish: dict[str, Any] = {"type": "stop", "matched": eos}
        if len(ids) > limit:
            ids, finish = ids[:limit], {"type": "length", "length": limit}
        meta: dict[str, Any] = {
            "id": f"fake-{next(self._ids)}",
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "cached_tokens": self.radix.insert(prompt),
            "weight_version": self.weight_version,
        }
        if logprobs:
            meta["output_token_logprobs"] = [[stand_in_logprob(t), t, None] for t in ids]
        return {
            "text": self.tokenizer.decode(ids),
            "output_ids": ids,
            "meta_info": meta,
        }


def read_safetensors(directory: str | Path) -> dict[str, Any]:
    """Every tensor of the directory's ``*.safetensors`` files, by name."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        return {}
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def stand_in_logprob(token: int) -> float:
    return -((token % 7) + 1) / 10


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    @property
    def fake(self) -> FakeSGLang:
        return self.server.fake  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        if not self.fake.authorised(self.path, self.headers.get("Authorization")):
            self._answer(401, {"error": "Unauthorized"})
            return
        self._answer(*self.fake.get(self.path))

    def do_POST(self) -> None:
        fake = self.fake
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not fake.authorised(self.path, self.headers.get("Authorization")):
            self._answer(401, {"error": "Unauthorized"})
            return
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            self._answer(400, {"error": {"message": "body is not JSON"}})
            return
        if self.path == "/generate" and fake.faults and fake.faults[0] == "drop":
            fake.faults.pop(0)
            fake.log.append((self.path, body))
            self.close_connection = True  # hang up without a word
            return
        self._answer(*fake.post(self.path, body))

    def _answer(self, code: int, content: Any) -> None:
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        kind = "text/plain" if isinstance(content, bytes) and code >= 500 else "application/json"
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    ap = argparse.ArgumentParser(description="stand-in SGLang server for tests")
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--enable-deterministic-inference", action="store_true")
    ap.add_argument("--api-key")
    ap.add_argument("--dp-size", type=int, default=1)
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--mem-fraction-static", type=float)
    ap.add_argument("--attention-backend")
    ap.add_argument("--fake-startup", type=float, default=0.0)
    ap.add_argument("--fake-decode-delay", type=float, default=0.0)
    ap.add_argument("--fake-legacy", action="store_true")
    a = ap.parse_args()  # an unknown flag exits with code 2, as sglang's own parser does
    fake = FakeSGLang(
        a.model_path,
        a.host,
        a.port,
        deterministic=a.enable_deterministic_inference,
        api_key=a.api_key,
        startup=a.fake_startup,
        decode_delay=a.fake_decode_delay,
        legacy=a.fake_legacy,
        server_args={
            "dp_size": a.dp_size,
            "tp_size": a.tp_size,
            "mem_fraction_static": a.mem_fraction_static,
            "attention_backend": a.attention_backend,
        },
    )
    fake.announce = True
    print(f"stand-in SGLang serving {a.model_path} at {fake.url}", flush=True)
    fake.httpd.serve_forever()


if __name__ == "__main__":
    main()

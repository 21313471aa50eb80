"""A stand-in for an SGLang server: SGLang needs a CUDA GPU, and this machine has none.

It speaks the request and response shapes of sglang 0.5.x's native HTTP API as SGLang documents
them (the sources are cited in policy/sglang.py): ``POST /generate`` with a batch of
``input_ids`` and one ``sampling_params`` dict per prompt, answering a list of ``{"text",
"output_ids", "meta_info"}`` whose ``meta_info`` holds ``finish_reason``, ``prompt_tokens``,
``weight_version`` and ``output_token_logprobs`` as ``[logprob, token_id, null]`` triples;
``GET /health``; ``GET /get_model_info``; ``POST /pause_generation``, ``/update_weights_from_disk``
(``{"success", "message", "num_paused_requests"}``, HTTP 400 on failure) and
``/continue_generation``. Bad requests get HTTP 400 with ``{"error": {"message": ...}}``.

What it cannot be is a model. It "decodes" a prompt by drawing a random string from the
request's ``regex`` (seeded by ``sampling_seed``), so it honours the constraint the way a
constrained decoder does; it tokenises that string with the model's real tokenizer and appends
EOS; its logprobs are stand-in numbers (a fixed function of the token id), not a model's. EBNF
requests get the fixed answer :attr:`FakeSGLang.ebnf_text` (it does not parse EBNF).

Faults are scripted per ``/generate`` call through :attr:`FakeSGLang.faults`: ``"500"``/``"503"``
(an error status), ``"400"``, ``"malformed"`` (a body that is not JSON), ``"bad-shape"`` (JSON
without ``meta_info``), ``"positive-logprob"``, ``"ids-mismatch"`` (``output_ids`` that disagree
with the logprobs), ``"unfinished"`` (``finish_reason`` null), ``"short-batch"`` (one answer too
few), ``"drop"`` (close the connection without answering), ``"hang"`` (answer
after :attr:`FakeSGLang.hang` seconds), ``"abort-first"`` (the first prompt of the batch comes back
aborted), ``"refuse-first"`` (aborted with status 400, as for a grammar the server rejects).

In-process: ``FakeSGLang(tokenizer_dir).start()``; as a process (what ``SGLangServer.launch``
starts in place of ``sglang serve`` in the tests): ``python tests/sglang_fake.py --model-path DIR
--host 127.0.0.1 --port P``. It only ever binds loopback addresses.
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# Characters a negated class ([^"\n]) is drawn from: enough to exercise quoting and spacing.
ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,:;!?'-_()#/+*=\t"


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


class FakeSGLang:
    """The stand-in server; see the module docstring. Every request is appended to :attr:`log`
    as ``(path, body)``."""

    def __init__(self, model_path: str | Path, host: str = "127.0.0.1", port: int = 0) -> None:
        from transformers import AutoTokenizer

        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the fake server binds loopback only, not {host!r}")
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        self.weight_version = "default"
        self.paused = False
        self.log: list[tuple[str, Any]] = []
        self.faults: list[str] = []
        self.hang = 1.0
        self.ebnf_text = "wait 1"
        self._ids = itertools.count()
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.fake = self  # type: ignore[attr-defined]

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeSGLang:
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def posts(self, path: str) -> list[Any]:
        return [body for p, body in self.log if p == path]

    # -- endpoints ------------------------------------------------------------------------------

    def get(self, path: str) -> tuple[int, Any]:
        if path == "/health":
            return 200, b""
        if path == "/get_model_info":
            return 200, {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "weight_version": self.weight_version,
            }
        return 404, {"detail": "Not Found"}

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        self.log.append((path, body))
        if path == "/generate":
            return self.generate(body)
        if path == "/pause_generation":
            self.paused = True
            return 200, {"message": "Generation paused successfully.", "status": "ok"}
        if path == "/continue_generation":
            self.paused = False
            return 200, {"message": "Generation continued successfully.", "status": "ok"}
        if path == "/update_weights_from_disk":
            model_path = body.get("model_path")
            if not model_path or not (Path(model_path) / "config.json").is_file():
                return 400, {
                    "success": False,
                    "message": f"Failed to get weights iterator: {model_path}",
                    "num_paused_requests": 0,
                }
            self.weight_version = body.get("weight_version") or self.weight_version
            return 200, {
                "success": True,
                "message": "Succeeded to update model weights.",
                "num_paused_requests": 0,
            }
        return 404, {"detail": "Not Found"}

    def generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        fault = self.faults.pop(0) if self.faults else None
        if fault in ("500", "503"):
            return int(fault), {"error": {"message": "stand-in server failure"}}
        if fault == "400":
            return 400, {"error": {"message": "stand-in bad request"}}
        if fault == "malformed":
            return 200, b'{"text": "add 1", "meta_info": '
        if fault == "hang":
            time.sleep(self.hang)
        prompts, params = body.get("input_ids"), body.get("sampling_params")
        if not (
            isinstance(prompts, list)
            and all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompts)
            and isinstance(params, list)
            and len(params) == len(prompts)
        ):
            return 400, {"error": {"message": "input_ids must be a batch, one params dict each"}}
        if body.get("return_logprob") is not True:
            return 400, {"error": {"message": "these tests always ask for logprobs"}}
        if fault == "bad-shape":
            return 200, [{"text": "add 1"} for _ in prompts]
        out = []
        for k, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            if fault in ("abort-first", "refuse-first") and k == 0:
                finish = {"type": "abort", "message": "Abort before prefill"}
                if fault == "refuse-first":
                    finish = {"type": "abort", "message": "Invalid grammar", "status_code": 400}
                out.append({"text": "", "output_ids": [], "meta_info": {"finish_reason": finish}})
                continue
            if sum(key in p for key in ("regex", "ebnf", "json_schema")) != 1:
                return 400, {"error": {"message": "Only one of regex, json_schema, or ebnf"}}
            out.append(self.decode(prompt, p))
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

    def decode(self, prompt: list[int], p: dict[str, Any]) -> dict[str, Any]:
        seed = p.get("sampling_seed")
        rng = random.Random(seed if seed is not None else next(self._ids))
        text = sample_regex(p["regex"], rng) if "regex" in p else self.ebnf_text
        eos = self.tokenizer.eos_token_id
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), eos]
        limit = p["max_new_tokens"]
        finish: dict[str, Any] = {"type": "stop", "matched": eos}
        if len(ids) > limit:
            ids, finish = ids[:limit], {"type": "length", "length": limit}
        return {
            "text": self.tokenizer.decode(ids, skip_special_tokens=True),
            "output_ids": ids,
            "meta_info": {
                "id": f"fake-{next(self._ids)}",
                "finish_reason": finish,
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "cached_tokens": 0,
                "weight_version": self.weight_version,
                "output_token_logprobs": [[stand_in_logprob(t), t, None] for t in ids],
            },
        }


def stand_in_logprob(token: int) -> float:
    return -((token % 7) + 1) / 10


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        self._answer(*self.server.fake.get(self.path))  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        fake: FakeSGLang = self.server.fake  # type: ignore[attr-defined]
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(raw)
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
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    ap = argparse.ArgumentParser(description="stand-in SGLang server for tests")
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    a, _ = ap.parse_known_args()
    fake = FakeSGLang(a.model_path, a.host, a.port)
    print(f"stand-in SGLang serving {a.model_path} at {fake.url}", flush=True)
    fake.httpd.serve_forever()


if __name__ == "__main__":
    main()

"""The shapes of SGLang's ``/generate``: the sampling parameters a request is sent with, and an
answer read back as a :class:`PolicyResponse`, checked against the documented shape (paths are in
sgl-project/sglang):

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
  recompute), one of ``regex``/``ebnf``, and ``sampling_seed`` (honoured only by servers that
  :mod:`policy.sglang.health` admits). An unknown key is a TypeError there, which /generate does
  not catch: HTTP 500.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from collective.base.actions import ActionSpace
from policy.base import PolicyError, PolicyRequest, PolicyResponse
from policy.constraint import action_ebnf, action_regex
from policy.sglang.spec import Constraint

_SEED_MASK = (1 << 63) - 1  # SGLang keeps seeds in int64 tensors
_MIN_TEMPERATURE = 1e-5  # SGLang treats lower temperatures as greedy decoding
_LOGPROB_SLACK = 1e-3  # a logprob above this is not rounding, it is a broken answer


class Aborted(Exception):
    """The server aborted one prompt of a batch, e.g. because generation was paused."""


@functools.lru_cache(maxsize=256)
def _constraint(space: ActionSpace, kind: Constraint) -> str:
    return action_regex(space) if kind == "regex" else action_ebnf(space)


def sampling_params(
    r: PolicyRequest, name: str, constraint: Constraint, seeded: bool
) -> dict[str, Any]:
    """The ``sampling_params`` of one request (``name``: the policy's, for errors)."""
    if r.temperature < _MIN_TEMPERATURE:
        raise PolicyError(
            f"{name}: agent {r.agent} turn {r.turn} asks temperature {r.temperature}; "
            f"below {_MIN_TEMPERATURE} SGLang samples greedily and its logprobs are not the "
            "sampling distribution's"
        )
    if r.top_p != 1.0:
        # The learner's ratios need the behaviour logprobs of the distribution sampled;
        # whether SGLang's reported logprobs are taken before or after its nucleus is
        # renormalised is not checked here, so a nucleus is sampled in-process only.
        raise PolicyError(
            f"{name}: agent {r.agent} turn {r.turn} asks top_p {r.top_p}; the SGLang "
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
        constraint: _constraint(r.space, constraint),
    }
    if seeded:
        p["sampling_seed"] = r.seed & _SEED_MASK
    return p


def parse_answer(
    url: str,
    item: Any,
    req: PolicyRequest,
    n_prompt: int,
    version: int,
    tokenizer: Any,
    check_label: Callable[[Any, Callable[[str], PolicyError]], None],
) -> tuple[PolicyResponse, int]:
    """One answer as a response, and the prompt tokens the server's cache served for it (0 when
    it does not say); :class:`Aborted` when the server aborted it for a reason that may pass (a
    pause), a :class:`PolicyError` for any other answer. ``check_label`` judges the weight
    version the answer reports (the fleet's: it knows what it loaded or follows)."""

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
        raise Aborted(str(reason.get("message", "aborted")))
    if kind not in ("stop", "length"):
        raise bad(f"finish_reason {finish!r}")
    check_label(meta.get("weight_version"), bad)
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
    counted = 0
    if isinstance(cached, int) and not isinstance(cached, bool) and 0 <= cached <= n_prompt:
        counted = cached
    text = item.get("text")
    if not isinstance(text, str):
        text = tokenizer.decode(ids, skip_special_tokens=True)
    response = PolicyResponse(
        text=text, token_ids=ids, logprobs=logprobs, prompt_tokens=n_prompt, version=version
    )
    return response, counted

"""The ``sglang:`` spec (``--policy``, or ``hf_server`` in a train config), split into words like
a shell line (quote a path with spaces)::

    sglang:URL[,URL...] [OPTION=VALUE ...]
    sglang:launch:MODEL_DIR [OPTION=VALUE ...] [-- SGLANG_ARG ...]

Client options, for both: ``seeds=on|off`` (default on), ``api-key-env=VAR`` (the API key is
read from that environment variable, never written into the spec, which episodes record),
``wait=SECONDS`` (how long a server may answer 503 while it loads; default 900),
``timeout=SECONDS`` (one attempt at one call; default 120), ``deadline=SECONDS`` (one batch in
all; default 600), ``constraint=regex|ebnf``, ``tokenizer=DIR`` (a local copy of the model's
tokenizer, for servers on other machines; by default the directory the server reports is read),
``weights=disk|tensor|distributed|auto`` (how a weight update reaches the servers; default
disk; see :mod:`policy.sglang.client`) and ``sync-timeout=SECONDS`` (the deadline of one step of
an in-memory update: forming the group, one bucket; default 60), ``update-deadline=SECONDS``
(one weight update in all, however its calls, retries and buckets add up; default 1800).
With ``launch``, every other ``NAME=VALUE`` becomes the server flag ``--NAME VALUE`` (``dp`` and
``tp`` stand for ``--dp-size`` and ``--tp-size``), words after ``--`` are passed to the server as
they are, and the server is always started with ``--enable-deterministic-inference`` while seeds
are on (and ``--api-key`` when a key is given).
For example ``sglang:launch:models/qwen dp=2 mem-fraction-static=0.8 -- --attention-backend
triton`` or ``sglang:http://gpu1:30000,http://gpu2:30000 api-key-env=SGLANG_API_KEY``.

:func:`parse_spec` reads it into an :class:`SGLangSpec` (touching no network, starting nothing);
:func:`policy.sglang.client.policy_from_spec` builds the policy it names.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any, Literal

import httpx
import msgspec

from collective.base.args import parse_float

Constraint = Literal["regex", "ebnf"]
WeightsMethod = Literal["disk", "tensor", "distributed", "auto"]
WEIGHTS_METHODS: tuple[WeightsMethod, ...] = ("disk", "tensor", "distributed", "auto")

_CLIENT_OPTIONS = (
    "seeds",
    "api-key-env",
    "wait",
    "timeout",
    "deadline",
    "constraint",
    "tokenizer",
    "weights",
    "sync-timeout",
    "update-deadline",
)
_SECONDS_OPTIONS = (
    "wait",
    "timeout",
    "deadline",
    "sync-timeout",
    "update-deadline",
)  # a finite number of seconds > 0 each
_FLAG_ALIASES = {"dp": "--dp-size", "tp": "--tp-size"}
_OWNED_FLAGS = ("--model-path", "--host", "--port", "--api-key")  # set by the launcher itself


class SGLangSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed ``sglang:...`` spec (see the module docstring)."""

    urls: tuple[str, ...] = ()
    model: str = ""  # launch: the model directory
    server_args: tuple[str, ...] = ()  # launch: after --model-path/--host/--port
    seeds: bool = True
    api_key_env: str = ""
    wait: float = 900.0
    timeout: float = 120.0  # one attempt at one call
    deadline: float = 600.0  # one batch in all
    constraint: Constraint = "regex"
    tokenizer: str = ""  # a local tokenizer directory (default: the one the server names)
    weights: WeightsMethod = "disk"  # how a weight update reaches the servers
    sync_timeout: float = 60.0  # one in-memory weight transfer step (a bucket, the group)
    update_deadline: float = 1800.0  # one weight update in all

    def launch_args(self, api_key: str | None) -> list[str]:
        """The flags a launched server gets after --model-path, --host and --port."""
        args = list(self.server_args)
        if self.seeds:
            args.append("--enable-deterministic-inference")
        if api_key:
            args += ["--api-key", api_key]
        return args


def parse_spec(arg: str) -> SGLangSpec:
    """``arg`` is what follows ``sglang:``; a :class:`ValueError` names what is wrong."""

    def bad(why: str) -> ValueError:
        return ValueError(f"policy sglang:{arg}: {why}")

    try:
        words = shlex.split(arg)
    except ValueError as e:
        raise bad(f"cannot split it into words ({e})") from None
    if not words:
        raise bad("expected sglang:URL[,URL...] or sglang:launch:MODEL_DIR")
    head, rest, raw = words[0], words[1:], []
    if "--" in rest:
        cut = rest.index("--")
        rest, raw = rest[:cut], rest[cut + 1 :]
    options: dict[str, str] = {}
    for word in rest:
        key, eq, value = word.partition("=")
        if not (key and eq and value):
            raise bad(f"{word!r} is not OPTION=VALUE (server flags without a value go after --)")
        if key in options:
            raise bad(f"option {key!r} is given twice")
        options[key] = value
    fields: dict[str, Any] = {}
    if head.startswith("launch:"):
        fields["model"] = head.removeprefix("launch:")
        if not fields["model"]:
            raise bad("sglang:launch:MODEL_DIR needs a model directory")
    elif head == "launch":
        raise bad("sglang:launch:MODEL_DIR needs a model directory")
    else:
        urls = head.split(",")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise bad(f"{url!r} is not an http:// or https:// URL (or launch:MODEL_DIR)")
            try:
                httpx.URL(url)
            except httpx.InvalidURL as e:
                raise bad(f"{url!r} is not a valid URL ({e})") from None
        if len(set(urls)) != len(urls):
            raise bad("a server URL is given twice")
        fields["urls"] = tuple(urls)
        if raw:
            raise bad("arguments after -- are for a server this program launches (launch:DIR)")
    seeds = options.pop("seeds", "on")
    if seeds not in ("on", "off"):
        raise bad(f"seeds must be on or off, not {seeds!r}")
    fields["seeds"] = seeds == "on"
    for key in _SECONDS_OPTIONS:
        if key not in options:
            continue
        text = options.pop(key)
        try:  # (numbers as every flag reads them: ASCII digits, no spaces)
            fields[key.replace("-", "_")] = parse_float(text)
        except ValueError:
            raise bad(f"{key} must be a number of seconds, not {text!r}") from None
        if not (math.isfinite(fields[key.replace("-", "_")]) and fields[key.replace("-", "_")] > 0):
            raise bad(f"{key} must be a number of seconds > 0, not {text!r}")
    if "api-key-env" in options:
        fields["api_key_env"] = options.pop("api-key-env")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", fields["api_key_env"]):
            raise bad(f"api-key-env={fields['api_key_env']!r} is not an environment variable name")
    if "constraint" in options:
        fields["constraint"] = options.pop("constraint")
        if fields["constraint"] not in ("regex", "ebnf"):
            raise bad(f"constraint must be regex or ebnf, not {fields['constraint']!r}")
    if "tokenizer" in options:
        fields["tokenizer"] = options.pop("tokenizer")
    if "weights" in options:
        fields["weights"] = options.pop("weights")
        if fields["weights"] not in WEIGHTS_METHODS:
            raise bad(
                f"weights must be one of {', '.join(WEIGHTS_METHODS)}, not {fields['weights']!r}"
            )
    if options and not fields.get("model"):
        raise bad(
            f"unknown option(s) {', '.join(options)}; a URL spec takes {', '.join(_CLIENT_OPTIONS)}"
        )
    args: list[str] = []
    for key, value in options.items():
        if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
            raise bad(f"{key!r} is not a server flag name (like mem-fraction-static)")
        args += [_FLAG_ALIASES.get(key, f"--{key}"), value]
    for flag in [*args[::2], *raw]:
        if flag.split("=")[0] in _OWNED_FLAGS:
            name = flag.split("=")[0]
            raise bad(f"{name} is set by the launcher (use api-key-env=VAR for a key)")
    fields["server_args"] = (*args, *raw)
    return SGLangSpec(**fields)

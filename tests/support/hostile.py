"""Worlds, policies and forgeries that misbehave on purpose, for the bad-input and integrity
tests.

``MARKER``: importing this file creates the file named by the environment variable
``COLLECTIVE_TEST_MARKER`` (if set), so a test can tell whether opening an episode imported it.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from collective import Range, World, tool
from collective.records import FORMAT, MAGIC
from policy.base import PolicyRequest, PolicyResponse

if os.environ.get("COLLECTIVE_TEST_MARKER"):
    Path(os.environ["COLLECTIVE_TEST_MARKER"]).write_text("imported\n")


class Scoreless(World):
    """Forgot to define score()."""

    @tool(duration=1.0)
    def poke(self, agent: int) -> str:
        return "poked"

    def observe(self, agent: int) -> str:
        return "nothing"


class Exploding(World):
    """Its constructor fails."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        raise RuntimeError("the constructor blew up")


class Counter(World):
    """A plain world; what matters is that it lives in a file, not in the package."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.count = 0

    @tool(duration=2.0)
    def add(self, agent: int, n: Annotated[int, Range(1, 3)]) -> str:
        self.count = min(20, self.count + n)
        return f"count {self.count}"

    def observe(self, agent: int) -> str:
        return f"count {self.count}"

    def score(self) -> float:
        return self.count / 20


class Hider(Counter):
    """An attribute named like a tool hides it (every call would fail)."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        super().__init__(n_agents, seed)
        self.add = [1, 2]  # type: ignore[assignment,method-assign]


class NoSuper(World):
    """Forgot ``super().__init__``."""

    def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
        self.count = 0

    def observe(self, agent: int) -> str:
        return "nothing"

    def score(self) -> float:
        return 0.0


class Blind(World):
    """Forgot ``observe``."""

    def score(self) -> float:
        return 0.0


class DurationTypo(Counter):
    @tool(duration="sconds")
    def wait_a_bit(self, agent: int) -> str:
        return "waited"


class DomainTypo(Counter):
    @tool(duration=1.0)
    def take(self, agent: int, n: Annotated[int, Range(0, "mx")]) -> str:
        return "taken"


class Flood:
    """A policy whose every answer is ``chars`` characters in ``tokens`` tokens: a broken or
    hostile server. The text starts with a valid action, so only the bound can refuse it."""

    name = "flood"
    version = 0

    def __init__(self, chars: int, tokens: int) -> None:
        self.chars, self.tokens = chars, tokens

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        text = ("add 1" + " " * self.chars)[: self.chars]
        return [
            PolicyResponse(
                text=text,
                token_ids=[32] * self.tokens,
                logprobs=[-0.5] * self.tokens,
                prompt_tokens=len(r.prompt),
            )
            for r in requests
        ]

    async def aclose(self) -> None:
        return None


def seal(body: bytes) -> bytes:
    """An episode file around ``body`` with a correct header, written from the layout documented
    in ``collective.records`` (not with its writer): what someone who edits an episode and
    digests it again produces."""
    head = struct.pack(">8sHHQ", MAGIC, FORMAT, 0, len(body))
    return head + hashlib.blake2b(head + body, digest_size=32).digest() + body


def seal_parts(parts: list[Any]) -> bytes:
    """The same, in the streamed layout: each part msgpack, one zstd frame (level 3) after its
    big-endian length; the digest over the body, then the header's first 20 bytes."""
    import msgspec
    import zstandard

    zstd = zstandard.ZstdCompressor(level=3)
    frames = [zstd.compress(msgspec.msgpack.encode(p)) for p in parts]
    body = b"".join(struct.pack(">I", len(f)) + f for f in frames)
    head = struct.pack(">8sHHQ", MAGIC, FORMAT, 1, len(body))
    return head + hashlib.blake2b(body + head, digest_size=32).digest() + body


def as_parts(d: dict[str, Any]) -> list[Any]:
    """An episode as plain data (``msgspec.to_builtins``) -> the parts its file holds, as plain
    data: turns as answered, their outcomes apart in the order (finished, index)."""
    blank = {"tool": "", "kind": "", "ok": False, "result": "", "finished": -1.0}
    ends = sorted(
        (
            [i, t["tool"], t["kind"], t["ok"], t["result"], t["finished"]]
            for i, t in enumerate(d["turns"])
            if t["kind"]
        ),
        key=lambda e: (e[5], e[0]),
    )
    turns = [{**t, **blank} for t in d["turns"]]
    chunk = ["chunk", d["events"], turns, ends, d["spaces"], d["curve"]]
    closing = ["close", d["score"], d["duration"], d["end"], d["stats"], d["world_metrics"]]
    return [["open", d["config"]], chunk, [*closing, len(d["turns"])]]

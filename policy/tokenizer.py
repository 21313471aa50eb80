"""A byte-level tokenizer: the simplest one that needs no download and covers any text.

Ids 0..255 are bytes; then a few specials. The random and scripted policies count tokens with it
so their latencies match the tiny model's, where one token is one byte.
"""

from __future__ import annotations

PAD, BOS, EOS = 256, 257, 258
VOCAB_SIZE = 259


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def count(text: str) -> int:
    return len(text.encode("utf-8"))

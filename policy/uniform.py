"""The ``random`` policy: a uniformly random valid action, from each agent's own stream.

It picks a tool uniformly, then each argument uniformly within its domain; text arguments are a
few words from the argument's suggested vocabulary. The log-probability of each decision is put
on the first token of the span it produced (zeros elsewhere), so the per-token logprobs sum to
the log-probability of the draws that made the action. That is the action's own log-probability
except for text arguments, which several draws can spell alike (a word drawn and then dropped for
length); nothing trains on this policy's logprobs, so the sum of the draws is what it reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from collective.base.actions import ArgSpec, ToolSpec
from collective.base.seeding import Stream
from policy import tokenizer
from policy.base import PolicyRequest, PolicyResponse

_FALLBACK_WORDS = ("help", "done", "need", "have", "next", "ok", "wait", "go")


def _text_arg(spec: ArgSpec, rng: Stream, room: int) -> tuple[str, float]:
    """A text argument of at most ``spec.max_chars`` characters and ``room`` bytes."""
    words = spec.words or _FALLBACK_WORDS
    n = 1 + rng.below(3)
    lp = -math.log(3)
    out: list[str] = []
    for _ in range(n):
        w = words[rng.below(len(words))]
        lp -= math.log(len(words))
        joined = " ".join([*out, w])
        if len(joined) > spec.max_chars or len(joined.encode()) > room:
            break
        out.append(w)
    return '"' + " ".join(out) + '"', lp


def _least(a: ArgSpec) -> int:
    """The bytes an argument is given before it is drawn: an int at its widest (a few bytes),
    a choice at its shortest, a text its two quotes."""
    if a.kind == "int":
        return max(len(str(a.lo)), len(str(a.hi)))
    if a.kind == "choice":
        return min(len(c.encode()) for c in a.choices)
    return 2


def _spare(spec: ToolSpec, max_tokens: int) -> int:
    """The bytes an action of this tool has beyond its arguments' ``_least`` under the answer's
    bound (a token a byte, and the end token)."""
    need = len(spec.name.encode()) + sum(1 + _least(a) for a in spec.args) + 1
    return max_tokens - need


def sample_action(req: PolicyRequest) -> tuple[str, list[int], list[float]]:
    """A uniformly random action that fits the answer's bound (``max_tokens``): an answer past
    it is rejected (``collective.engine.conductor.bounded``), and a random team's actions are valid
    ones. Tools, choices and words that cannot fit are not drawn; while the bound does not
    bite, every draw is what it was before the bound was heeded (the same episodes)."""
    rng = Stream(req.seed)
    tools = [t for t in req.space.tools if _spare(t, req.max_tokens) >= 0] or req.space.tools
    spec = tools[rng.below(len(tools))]
    pieces = [spec.name]
    piece_lps = [-math.log(len(tools))]
    room = _spare(spec, req.max_tokens)
    for a in spec.args:
        if a.kind == "int":
            pieces.append(str(a.lo + rng.below(a.hi - a.lo + 1)))
            piece_lps.append(-math.log(a.hi - a.lo + 1))
            room += _least(a) - len(pieces[-1])
        elif a.kind == "choice":
            least = _least(a)
            choices = [c for c in a.choices if len(c.encode()) - least <= room] or a.choices
            pieces.append(choices[rng.below(len(choices))])
            piece_lps.append(-math.log(len(choices)))
            room -= len(pieces[-1].encode()) - least
        else:
            text, lp = _text_arg(a, rng, max(room, 0))
            room -= len(text.encode()) - 2
            pieces.append(text)
            piece_lps.append(lp)
    text = " ".join(pieces)
    ids = tokenizer.encode(text)
    lps = [0.0] * len(ids)
    at = 0
    for piece, lp in zip(pieces, piece_lps, strict=True):
        lps[at] = lp  # on the piece's first byte (after the space that separates it)
        at += len(piece.encode()) + 1
    ids.append(tokenizer.EOS)
    lps.append(0.0)
    return text, ids, lps


def respond(req: PolicyRequest) -> PolicyResponse:
    """One request's answer; synchronous, so a benchmark's other loops can call it as is."""
    text, ids, lps = sample_action(req)
    return PolicyResponse(
        text=text,
        token_ids=ids,
        logprobs=lps,
        prompt_tokens=tokenizer.count(req.prompt),
        version=0,
    )


class RandomPolicy:
    """Samples valid actions uniformly; its version is always 0 (it never learns)."""

    name = "random"
    version = 0
    tokenizer_name = "bytes"  # its token ids (see collective.replay.tokenizer_of)

    async def generate(self, requests: Sequence[PolicyRequest]) -> list[PolicyResponse]:
        return [respond(r) for r in requests]

    async def aclose(self) -> None:
        return None

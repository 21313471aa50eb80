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

from collective.actions import ArgSpec
from collective.seeding import Stream
from policy import tokenizer
from policy.base import PolicyRequest, PolicyResponse

_FALLBACK_WORDS = ("help", "done", "need", "have", "next", "ok", "wait", "go")


def _text_arg(spec: ArgSpec, rng: Stream) -> tuple[str, float]:
    words = spec.words or _FALLBACK_WORDS
    n = 1 + rng.below(3)
    lp = -math.log(3)
    out: list[str] = []
    for _ in range(n):
        w = words[rng.below(len(words))]
        lp -= math.log(len(words))
        if len(" ".join([*out, w])) > spec.max_chars:
            break
        out.append(w)
    return '"' + " ".join(out) + '"', lp


def sample_action(req: PolicyRequest) -> tuple[str, list[int], list[float]]:
    rng = Stream(req.seed)
    tools = req.space.tools
    spec = tools[rng.below(len(tools))]
    pieces = [spec.name]
    piece_lps = [-math.log(len(tools))]
    for a in spec.args:
        if a.kind == "int":
            pieces.append(str(a.lo + rng.below(a.hi - a.lo + 1)))
            piece_lps.append(-math.log(a.hi - a.lo + 1))
        elif a.kind == "choice":
            pieces.append(a.choices[rng.below(len(a.choices))])
            piece_lps.append(-math.log(len(a.choices)))
        else:
            text, lp = _text_arg(a, rng)
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

"""The action grammar as xgrammar token masks, and the one distribution sampled and scored.

SGLang constrains decoding with xgrammar (its default grammar backend). This module compiles the
same grammar (:func:`policy.constraint.action_ebnf`, which accepts exactly the strings of
:func:`policy.constraint.action_regex` that the SGLang client may send instead) with xgrammar
over the model's own tokenizer and vocabulary. The in-process sampler (:mod:`policy.hf.policy`),
the learner (:mod:`policy.hf.model`) and an SGLang server therefore forbid the same tokens at every
step, and the behaviour logprobs a sampler reports are the ones the learner recomputes.

A mask is xgrammar's packed bitmask: int32 words, token ``i`` allowed when bit ``i % 32`` of
word ``i // 32`` is set. Masks stay packed (a 152k vocabulary is 19 KB a position) until the
moment they are applied, where :func:`unpack` turns a slice of them into booleans on the
device of the logits. Both sides apply them through :func:`masked_logits`, so "the same
distribution" is one function, not two that must agree:

    logits / temperature, forbidden tokens set to FORBIDDEN, then (log-)softmax;

and with ``top_p`` below 1, the tokens outside the nucleus set to FORBIDDEN too, by SGLang's
rule (``top_k_top_p`` in its sampler): sorted by probability, a token is kept while the mass
of those before it is at most ``top_p``, so the most likely token always is.

Stop tokens are the model's end-of-sequence ids (its generation config's, else the
tokenizer's), as SGLang passes them to its grammar backend: once an action is complete the mask
allows only them, and sampling one ends the output. An output cut by ``max_tokens`` before that
is left incomplete, as SGLang leaves it (finish reason ``length``); the actor rejects it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

import torch

from collective.base.actions import ActionSpace
from policy.constraint import action_ebnf

#: Added to a forbidden token's logit. Finite, unlike -inf, so gradients and probability-weighted
#: sums stay NaN-free; far enough below any real logit that its probability is exactly 0.0 in
#: float32.
FORBIDDEN = -1e30


class GrammarError(ValueError):
    """An action space whose grammar xgrammar cannot compile, or an output it does not accept."""


def _tools(space: ActionSpace) -> str:
    return ", ".join(t.name for t in space.tools)


class ActionGrammar:
    """xgrammar over one tokenizer and vocabulary: compiled grammars (one per action space,
    cached) and the masks along an output. Thread-safe: sampling threads share one."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]) -> None:
        import xgrammar as xgr

        if not stop_ids:
            raise GrammarError("the model has no end-of-sequence token: an action could not end")
        self.vocab_size = vocab_size
        self.stop_ids = sorted(set(stop_ids))
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_ids
        )
        self.words = xgr.get_bitmask_shape(1, vocab_size)[1]
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._compiled: dict[ActionSpace, Any] = {}
        self._lock = threading.Lock()

    def compiled(self, space: ActionSpace) -> Any:
        with self._lock:
            done = self._compiled.get(space)
        if done is not None:
            return done
        text = action_ebnf(space)
        try:
            done = self._compiler.compile_grammar(text)
        except RuntimeError as e:  # xgrammar reports a bad grammar as a RuntimeError
            why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise GrammarError(
                f"xgrammar cannot compile the action grammar of tools [{_tools(space)}]: {why}"
            ) from None
        with self._lock:
            self._compiled[space] = done
        return done

    def matcher(self, space: ActionSpace) -> Any:
        import xgrammar as xgr

        return xgr.GrammarMatcher(self.compiled(space))

    def masks(self, space: ActionSpace, tokens: Sequence[int], where: str) -> torch.Tensor:
        """The packed mask before each token of ``tokens`` ([len, words] int32, on the CPU):
        the matcher replayed along the output, exactly as the sampler advanced it."""
        matcher = self.matcher(space)
        out = torch.empty((len(tokens), self.words), dtype=torch.int32)
        for k, token in enumerate(tokens):
            if matcher.is_terminated():
                raise GrammarError(f"{where}: token {k} follows a finished action")
            matcher.fill_next_token_bitmask(out, k)
            if not matcher.accept_token(int(token)):
                raise GrammarError(
                    f"{where}: token {k} (id {token}) is not allowed by the action grammar of "
                    f"tools [{_tools(space)}]"
                )
        return out


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed int32 masks [..., words] as booleans [..., vocab_size], on the bitmask's device.

    Unpacked byte by byte (a little-endian int32 word's byte k holds tokens 8k..8k+7 of it), so
    the largest temporary is one byte per token, not four."""
    assert sys.byteorder == "little", "xgrammar's bitmask words are read as little-endian bytes"
    octets = bitmask.contiguous().view(torch.uint8)  # [..., words * 4]
    bits = torch.arange(8, dtype=torch.uint8, device=bitmask.device)
    allowed = (octets.unsqueeze(-1) >> bits) & 1
    return allowed.flatten(-2)[..., :vocab_size].bool()


def masked_logits(
    logits: torch.Tensor, temperature: float, bitmask: torch.Tensor, top_p: float = 1.0
) -> torch.Tensor:
    """The logits of the distribution sampled and scored: float32, over the temperature, with
    every token the grammar forbids, and every token outside the ``top_p`` nucleus (module
    docstring), at FORBIDDEN. ``bitmask`` is packed, one row per row of ``logits`` (moved to
    their device here)."""
    allowed = unpack(bitmask.to(logits.device), logits.shape[-1])
    z = logits.float() / temperature  # a new tensor: the fill below may write into it
    z = z.masked_fill_(~allowed, FORBIDDEN)
    if top_p < 1.0:
        # Which tokens are in the nucleus is a choice, not a function to differentiate: chosen
        # on detached probabilities; the kept logits keep their gradients.
        with torch.no_grad():
            p, order = torch.sort(torch.softmax(z, dim=-1), dim=-1, descending=True, stable=True)
            outside = (torch.cumsum(p, dim=-1) - p) > top_p
            outside = torch.zeros_like(outside).scatter_(-1, order, outside)
        z = z.masked_fill(outside, FORBIDDEN)
    return z

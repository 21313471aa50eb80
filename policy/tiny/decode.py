"""Sampling and scoring for the tiny model: the two must agree, so they live together.

Both apply the same distribution at every output position (``masked_logits``): the network's
logits divided by the temperature, with every token the grammar forbids (or that would leave
too few tokens to finish the action) given probability zero, then normalised. ``sample`` draws
from it; ``score`` recomputes the log-probability of each recorded token under it, with
gradients, for the learner.

Prompt truncation (``fit_prompt``): the network sees ``BOS`` + at most ``context - max_tokens -
1`` prompt bytes, so prompt and output always fit the context. A prompt that is too long is cut
in two: the head (everything before the ``last:`` line: the world's observation, then the
``inbox:`` / ``#channel:`` lines) and the tail (the ``last:`` line through the final ``>``; the
last line if there is no ``last:``). The tail keeps its final bytes, at least half the room (all
of it if shorter); the head fills the rest from its start. So the model always sees what the
world looks like, how its last action ended and where its answer begins; what it loses is the
end of a long message list, or the start of a very long result.

Randomness is counter-based: output token ``t`` of a request uses draw ``t + 1`` of
``collective.base.seeding.Stream(request.seed)`` (computed in torch for the whole batch at once) and
picks a token by inverting the CDF of the masked distribution.

Batch independence, bit for bit: a request's tokens and logprobs are the same floats whichever
other requests share its batch, in any order, however the batch is chunked and threaded, on any
x86 CPU. ``sample`` runs ``policy.tiny.invariant.SamplingNet``, whose every sum that a batch could
change (matrix products, attention's softmax) is exact; its module docstring says how and why.
What is left here works row by row over the vocabulary (masking, softmax, log-softmax, the
cumulative sum and search of ``_pick``), the same in any batch.

The learner's ``score`` runs the plain float32 network, so it agrees with the sampled logprobs
to about 1e-6, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from policy.grammar import BatchTables
from policy.tiny.invariant import SamplingNet
from policy.tiny.model import TinyTransformer
from policy.tokenizer import BOS, PAD

_NEWLINE_LAST = b"\nlast: "
SCORE_TOKENS = 16384  # padded tokens per scoring forward
_GOLDEN = 0x9E3779B97F4A7C15
_C1, _C2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def fit_prompt(prompt: str, room: int) -> list[int]:
    """``BOS`` + the prompt's bytes, cut to at most ``room`` tokens in all (module docstring)."""
    if room < 1:
        raise ValueError(f"prompt room must be >= 1 token, got {room}")
    data = prompt.encode("utf-8")
    room -= 1  # the BOS
    if len(data) <= room:
        return [BOS, *data]
    cut = data.rfind(_NEWLINE_LAST)
    cut = cut + 1 if cut >= 0 else data.rfind(b"\n") + 1  # the tail begins after the newline
    head, tail = data[:cut], data[cut:]
    keep = min(len(tail), max(room // 2, room - len(head)))  # the tail gets at least half
    tail = tail[len(tail) - keep :] if keep else b""
    return [BOS, *head[: room - len(tail)], *tail]


# -- counter-based uniforms, vectorised -------------------------------------------------------


def _signed(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def seeds_tensor(seeds: Sequence[int]) -> torch.Tensor:
    return torch.tensor([_signed(s) for s in seeds], dtype=torch.int64)


def uniforms(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """Draw ``step + 1`` of ``Stream(seed)`` for each seed, as float64 in [0, 1).

    int64 arithmetic wraps modulo 2**64 in torch, so this is SplitMix64 bit for bit (the tests
    compare it with ``collective.base.seeding``).
    """
    x = seeds + _signed((step + 1) * _GOLDEN)
    x = x + _signed(_GOLDEN)
    x = (x ^ _shr(x, 30)) * _signed(_C1)
    x = (x ^ _shr(x, 27)) * _signed(_C2)
    x = x ^ _shr(x, 31)
    return _shr(x, 11).to(torch.float64) * (1.0 / (1 << 53))


# -- the one distribution ---------------------------------------------------------------------

#: Added to the logit of a forbidden token. Finite, unlike -inf, so that gradients and
#: probability-weighted sums stay NaN-free (and CPU kernels stay on their fast paths); far
#: enough below any real logit that its probability is exactly 0.0 in float32.
FORBIDDEN = -1e30


def masked_logits(
    logits: torch.Tensor,
    cost: torch.Tensor,
    remaining: torch.Tensor,
    temperature: torch.Tensor | float,
) -> torch.Tensor:
    """``logits / temperature``, with every token whose grammar cost exceeds the tokens
    ``remaining`` (per row) pushed to ``FORBIDDEN``. Its softmax is the sampling distribution."""
    forbidden = (cost > remaining[:, None]).to(logits.dtype).mul_(FORBIDDEN)
    return logits / temperature + forbidden


def _pick(z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: the first token whose cumulative probability exceeds ``u``.

    The CDF is summed in float32 (float64 is several times slower here): a token is drawn with
    its reported probability to within about 1e-6, far below anything the learner can see, and
    the arithmetic is the same in every batch, so batch independence is untouched.

    A forbidden token has probability exactly 0, so it can never be the first to exceed the
    target, except in one corner: ``u`` within 2**-25 of 1 rounds to 1.0 in float32, the target
    is then the whole mass, no entry exceeds it, and ``searchsorted`` answers past the end. The
    right answer there is the last token with any probability, so the pick is capped at it
    (without the cap it was the last id, EOS, forbidden or not).
    """
    probs = torch.softmax(z, dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    target = (u.to(cdf.dtype) * cdf[:, -1])[:, None]
    picked = torch.searchsorted(cdf, target, right=True)[:, 0]
    ids = torch.arange(z.shape[-1], device=z.device)
    last_possible = torch.where(probs > 0, ids, -1).amax(dim=-1)
    return torch.minimum(picked, last_possible)


# -- sampling ---------------------------------------------------------------------------------


class Sampled:
    """Per request: the output tokens (EOS included) and their log-probabilities."""

    __slots__ = ("logprobs", "tokens")

    def __init__(self, tokens: list[int], logprobs: list[float]) -> None:
        self.tokens = tokens
        self.logprobs = logprobs


@torch.inference_mode()
def sample(
    net: SamplingNet,
    prompts: Sequence[list[int]],
    budgets: Sequence[int],
    temperatures: Sequence[float],
    seeds: Sequence[int],
    tables: BatchTables,
    starts: torch.Tensor,
) -> list[Sampled]:
    """Sample one action per row: ``prompts`` are fitted token ids, ``budgets`` the most output
    tokens of each row (EOS included; the grammar's cost mask makes every row finish within its
    budget), ``starts`` each row's start state in ``tables``. One forward batch: the caller
    chunks large batches. Each row's tokens and logprobs are a function of that row alone (see
    the module docstring for how)."""
    n = len(prompts)
    steps = max(budgets)
    h, cache = net.prefill(prompts, steps)
    pos = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.int64)  # last prompt token
    state = starts.clone()
    remaining = torch.tensor(budgets, dtype=torch.int32)
    temps = torch.tensor(temperatures, dtype=torch.float32)[:, None]
    seed_t = seeds_tensor(seeds)
    out_tok = torch.full((n, steps), PAD, dtype=torch.int64)
    out_lp = torch.zeros((n, steps), dtype=torch.float32)
    length = torch.zeros(n, dtype=torch.int64)
    rows = torch.arange(n)  # which rows the live tensors hold
    last_position = net.cfg.context - 1
    for t in range(steps):
        was_done = tables.final[state]  # finished, not yet dropped: DONE allows anything
        z = masked_logits(net.logits(h), tables.cost.index_select(0, state), remaining, temps)
        tok = _pick(z, uniforms(seed_t, t))
        out_tok[rows, t] = tok
        out_lp[rows, t] = torch.log_softmax(z, dim=-1).gather(1, tok[:, None])[:, 0]
        state = tables.next_state[state, tok]
        remaining -= 1
        done = tables.final[state]
        length[rows[done & ~was_done]] = t + 1
        n_live = len(rows) - int(done.sum())
        if n_live == 0:
            break
        if n_live <= 3 * len(rows) // 4:
            # Drop finished rows (less work per step), keeping the live ones in order.
            keep = (~done).nonzero()[:, 0]
            rows, state, remaining, temps, seed_t, pos, tok = (
                x[keep] for x in (rows, state, remaining, temps, seed_t, pos, tok)
            )
            cache = [(ints[keep], scales[keep]) for ints, scales in cache]
        # A finished row not yet dropped may walk past the context; its output is never read.
        pos = (pos + 1).clamp_(max=last_position)
        h = net.step(tok, pos, cache)
    if bool((length == 0).any()):
        raise AssertionError("a row did not finish within its budget (grammar cost mask broken)")
    return [
        Sampled(out_tok[k, : length[k]].tolist(), out_lp[k, : length[k]].tolist()) for k in range(n)
    ]


# -- scoring (the learner's side) -------------------------------------------------------------


def score(
    net: TinyTransformer,
    prompts: Sequence[list[int]],
    outputs: Sequence[Sequence[int]],
    budgets: Sequence[int],
    temperature: float,
    tables: BatchTables,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per sample: the log-probability of each output token under the distribution ``sample``
    drew it from, and that distribution's entropy, both differentiable.

    Causal forwards over ``prompt + output[:-1]``, right-padded, in groups of similar length;
    the last block and the head run only at the positions that predict an output token. Raises
    ValueError naming the sample and position of a token the mask forbids: the outputs were not
    sampled under these spaces and budgets.
    """
    b = len(prompts)
    if not b:
        return [], []
    lens = [len(o) for o in outputs]
    if min(lens) < 1:
        raise ValueError(f"sample {lens.index(0)}: empty output (it needs at least the EOS)")
    steps = max(lens)
    out = torch.full((b, steps), PAD, dtype=torch.int64)
    for i, o in enumerate(outputs):
        out[i, : len(o)] = torch.tensor(list(o), dtype=torch.int64)
    if int(out.max()) >= tables.cost.shape[1] or int(out.min()) < 0:
        raise ValueError("outputs contain token ids outside the vocabulary")
    # The automaton's state before each output token.
    states = torch.empty((b, steps), dtype=torch.int64)
    state = tables.start.clone()
    after = torch.empty((b, steps), dtype=torch.int64)
    for j in range(steps):
        states[:, j] = state
        state = tables.next_state[state, out[:, j]]
        after[:, j] = state
    row = torch.cat([torch.full((n,), i, dtype=torch.int64) for i, n in enumerate(lens)])
    step = torch.cat([torch.arange(n) for n in lens])
    tok = out[row, step]
    remaining = (torch.tensor(budgets, dtype=torch.int64)[row] - step).to(torch.int32)
    cost = tables.cost.index_select(0, states[row, step])
    ok = cost.gather(1, tok[:, None])[:, 0] <= remaining
    after_end = tables.final[states[row, step]]
    if bool(after_end.any()):
        i = int(row[int(after_end.nonzero()[0, 0])])
        raise ValueError(f"sample {i}: output has tokens after its EOS")
    if not bool(ok.all()):
        k = int((~ok).nonzero()[0, 0])
        i, j = int(row[k]), int(step[k])
        raise ValueError(
            f"sample {i}: output token {j} ({int(tok[k])}) is not allowed by its action space "
            f"with {int(remaining[k])} tokens left: wrong space, max_tokens or output"
        )
    ends = after[torch.arange(b), torch.tensor(lens) - 1]
    if not bool(tables.final[ends].all()):
        i = int((~tables.final[ends]).nonzero()[0, 0])
        raise ValueError(f"sample {i}: output does not end with a complete action and EOS")
    hidden = _hidden_at_outputs(net, prompts, outputs)
    z = masked_logits(net.logits(hidden), cost, remaining, temperature)
    logp = torch.log_softmax(z, dim=-1)
    lp = logp.gather(1, tok[:, None])[:, 0]
    entropy = -(torch.softmax(z, dim=-1) * logp).sum(dim=-1)  # forbidden: 0 * finite = 0
    return list(lp.split(lens)), list(entropy.split(lens))


def _hidden_at_outputs(
    net: TinyTransformer, prompts: Sequence[list[int]], outputs: Sequence[Sequence[int]]
) -> torch.Tensor:
    """Final hidden states at every position that predicts an output token, sample by sample
    (sample 0's tokens first). Sequences are sorted by length and run in groups of at most
    ``SCORE_TOKENS`` padded tokens, so short ones do not pay for the longest one's padding (and
    its quadratic attention)."""
    seqs = [[*p, *o[:-1]] for p, o in zip(prompts, outputs, strict=True)]
    offsets = [0]
    for o in outputs:
        offsets.append(offsets[-1] + len(o))
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    parts, where = [], []
    g0 = 0
    while g0 < len(order):
        g1 = g0 + 1
        while g1 < len(order) and (g1 + 1 - g0) * len(seqs[order[g1]]) <= SCORE_TOKENS:
            g1 += 1
        group = order[g0:g1]
        width = len(seqs[group[-1]])
        ids = torch.full((len(group), width), PAD, dtype=torch.int64)
        rows, cols = [], []
        for k, i in enumerate(group):
            ids[k, : len(seqs[i])] = torch.tensor(seqs[i], dtype=torch.int64)
            n = len(outputs[i])
            rows.append(torch.full((n,), k, dtype=torch.int64))
            cols.append(torch.arange(n) + len(prompts[i]) - 1)
            where.append(torch.arange(offsets[i], offsets[i] + n))
        pos = torch.arange(width).expand(len(group), width)
        parts.append(net.hidden(ids, pos, select=(torch.cat(rows), torch.cat(cols))))
        g0 = g1
    return torch.cat(parts)[torch.argsort(torch.cat(where))]

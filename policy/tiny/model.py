"""The tiny policy's network: a byte-level, decoder-only transformer small enough for 2 CPU cores.

Pre-norm blocks, learned positions, output head tied to the token embedding, and multi-query
attention (every query head shares one key head and one value head). The defaults (d_model 64,
2 layers, 4 heads, feed-forward 128, context 256 bytes: about 90k parameters; the training
configs' shape, with a context that leaves a 64-token answer 192 bytes of prompt) are chosen
for speed: RLCR on two cores runs many episodes of several agents for tens of turns each, so a
decode step over a batch of a thousand agents must take milliseconds, not seconds. Measured on
this machine (bench/policy.py, batch 1,024), the previous default (d_model 96, feed-forward 256)
samples about a third fewer tokens per second, and d_model 128 costs a quarter more per token
than that; multi-query attention is what makes large batches pay at all: a decode step reads
every row's whole key/value cache, and one shared key/value head makes that cache (and its
memory traffic) four times smaller.

One network, two ways to run it: ``hidden`` over whole right-padded sequences with a causal mask
(what the learner differentiates, and sampling's prefill, which also fills a key/value cache),
and ``step``, one new token per row against that cache (sampling's decode). Both compute the
same function; the tests hold them to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import torch
import torch.nn.functional as F
from torch import nn

from policy.tokenizer import VOCAB_SIZE


class TinyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The network's shape and the seed of its fresh weights."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4  # query heads; keys and values have one head of d_model / n_heads
    d_ff: int = 128
    context: int = 256  # tokens (bytes) of prompt plus output the network can see
    seed: int = 0  # fresh weights are a function of this seed alone

    def __post_init__(self) -> None:
        for field in ("d_model", "n_layers", "n_heads", "d_ff", "context"):
            if getattr(self, field) < 1:
                raise ValueError(f"tiny config: {field} must be >= 1, got {getattr(self, field)}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"tiny config: d_model {self.d_model} is not divisible by n_heads {self.n_heads}"
            )
        if self.context < 8:
            raise ValueError(f"tiny config: context must be >= 8 tokens, got {self.context}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


#: Rows a matrix product needs for MKL to round each row the same whatever the others: with
#: fewer, it takes other kernels (measured on torch 2.13's CPU build; see policy.tiny.decode).
MIN_ROWS = 4

#: A key/value cache: per layer, (keys, values), each (batch, positions, head_dim).
Cache = list[tuple[torch.Tensor, torch.Tensor]]


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, cfg.d_model + 2 * cfg.head_dim)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def qkv_split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (..., d_model), keys and values (..., head_dim) of normalised ``x``."""
        d = self.proj.in_features
        dh = (self.qkv.out_features - d) // 2
        return self.qkv(self.ln1(x)).split((d, dh, dh), dim=-1)

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of the block: output projection, residual, feed-forward, residual."""
        x = x + self.proj(attended)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(VOCAB_SIZE, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.reset(cfg.seed)

    def reset(self, seed: int) -> None:
        """Fresh weights from ``seed`` alone, with a private generator (never torch's global
        one), so two processes given the same seed build the same network."""
        g = torch.Generator().manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
        depth_scale = 1.0 / math.sqrt(2 * self.cfg.n_layers)  # residual writes, as in GPT-2
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif ".ln" in name or name.startswith("ln_"):
                    p.fill_(1.0)
                else:
                    residual = name.endswith(("proj.weight", "fc2.weight"))
                    p.normal_(0.0, 0.02 * (depth_scale if residual else 1.0), generator=g)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch: int, positions: int) -> Cache:
        shape = (batch, positions, self.cfg.head_dim)
        # Zeros, not garbage: a hidden column still enters the arithmetic (score + bias, weight
        # 0 times value), and uninitialised memory may hold NaN, which would spread.
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in range(self.cfg.n_layers)]

    def hidden(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache: Cache | None = None,
        last: torch.Tensor | None = None,
        select: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Final hidden states of right-padded sequences ``ids`` (batch, n) at positions ``pos``,
        with causal attention within them (pads come last, so no real token sees one).

        With ``cache``, every layer's keys and values are also written to its first n columns.
        With ``last`` (batch,), only column ``last[r]`` of row r is wanted: the result is
        (batch, d_model), and the final block runs its queries, projection and feed-forward at
        that column alone (the prefill of sampling, where nothing else is ever read).
        With ``select`` (rows, columns), only those N cells are wanted: the result is (N,
        d_model), and the final block's projection and feed-forward run there alone (what the
        learner scores: the positions that predict output tokens, a fraction of each sequence).
        Otherwise the result is (batch, n, d_model).
        """
        b, n = ids.shape
        heads, dh = self.cfg.n_heads, self.cfg.head_dim
        x = self.tok(ids) + self.pos(pos)
        for i, blk in enumerate(self.blocks):
            if last is not None and i == len(self.blocks) - 1:
                # Keys and values everywhere (the cache needs them), the rest at `last` only.
                rows = torch.arange(b)
                h = blk.ln1(x)
                w, bias = blk.qkv.weight, blk.qkv.bias
                d = self.cfg.d_model
                k, v = F.linear(h, w[d:], bias[d:]).split((dh, dh), dim=-1)
                q = F.linear(h[rows, last], w[:d], bias[:d])
                if cache is not None:
                    cache[i][0][:, :n] = k
                    cache[i][1][:, :n] = v
                a = _attend_one(q.view(b, heads, dh), k, v, _hide_after(last, n))
                return self.ln_f(blk.finish(x[rows, last], a.reshape(b, -1)))
            q, k, v = blk.qkv_split(x)
            if cache is not None:
                cache[i][0][:, :n] = k
                cache[i][1][:, :n] = v
            a = F.scaled_dot_product_attention(
                q.view(b, n, heads, dh).transpose(1, 2),
                k[:, None],
                v[:, None],
                is_causal=True,
                enable_gqa=True,
            )
            a = a.transpose(1, 2).reshape(b, n, -1)
            if select is not None and i == len(self.blocks) - 1:
                return self.ln_f(blk.finish(x[select], a[select]))
            x = blk.finish(x, a)
        return self.ln_f(x)

    def step(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache: Cache,
        spans: Sequence[tuple[int, int]] | None = None,
    ) -> torch.Tensor:
        """One new token per row: ``ids`` and ``pos`` are (batch,); row r's token goes to
        cache column ``pos[r]`` and attends to columns ``0..pos[r]``. Returns (batch, d_model).

        A row's attention runs over a fixed number of cache columns, those after ``pos[r]``
        masked: by default ``max(pos) + 1`` for every row. ``spans`` sets them per run of
        consecutive rows instead, as ``(end row, columns)`` pairs in row order; a caller that
        needs each row's result independent of the other rows makes the columns a function of
        the row alone (a softmax over more masked slots rounds differently). Everything else
        is one batched kernel over all rows.
        """
        b = ids.shape[0]
        heads, dh = self.cfg.n_heads, self.cfg.head_dim
        if spans is None:
            spans = [(b, int(pos.max()) + 1)]
        cuts, r0 = [], 0
        for r1, width in spans:
            cuts.append((r0, r1, width))
            r0 = r1
        hides = [_hide_after(pos[r0:r1], width) for r0, r1, width in cuts]
        rows = torch.arange(b)
        x = self.tok(ids) + self.pos(pos)
        for blk, (keys, values) in zip(self.blocks, cache, strict=True):
            q, k, v = blk.qkv_split(x)
            keys[rows, pos] = k
            values[rows, pos] = v
            q = q.view(b, heads, dh)
            parts = [
                _attend_one(q[r0:r1], keys[r0:r1, :w], values[r0:r1, :w], hide)
                for (r0, r1, w), hide in zip(cuts, hides, strict=True)
            ]
            a = parts[0] if len(parts) == 1 else torch.cat(parts)
            x = blk.finish(x, a.reshape(b, -1))
        return self.ln_f(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits from final hidden states (the head is the tied embedding)."""
        return hidden @ self.tok.weight.T


def _hide_after(last: torch.Tensor, width: int) -> torch.Tensor:
    """An additive attention bias (batch, 1, width): 0 at columns ``<= last[r]``, -1e30 after
    (finite, so a hidden column adds exactly 0 weight and never a NaN)."""
    hidden = torch.arange(width)[None, :] > last[:, None]
    return hidden.to(torch.float32).mul_(-1e30)[:, None, :]


def _attend_one(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, hide: torch.Tensor
) -> torch.Tensor:
    """One query position per row: q (batch, heads, head_dim) against keys and values (batch,
    positions, head_dim), plus the bias ``hide`` (batch, 1, positions). Two batched matrix
    products read each row's keys and values once for all heads.

    Each product has one matrix per row, with a row per head. With fewer than four such rows,
    MKL takes a kernel whose rounding depends on where the queries lie in memory (measured:
    their address modulo 16 bytes), hence on the row's place in the batch; so fewer than four
    heads are padded with zero queries, and sampling stays batch-independent whatever the
    shape (``policy.tiny.decode``)."""
    b, heads, dh = q.shape
    if heads < MIN_ROWS:
        q = torch.cat([q, q.new_zeros((b, MIN_ROWS - heads, dh))], dim=1)
    scores = torch.baddbmm(hide, q, keys.transpose(1, 2), alpha=dh**-0.5)
    return torch.bmm(torch.softmax(scores, dim=-1), values)[:, :heads]

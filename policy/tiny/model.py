"""The tiny policy's network: a byte-level, decoder-only transformer small enough for 2 CPU cores.

Pre-norm blocks, learned positions, output head tied to the token embedding, and multi-query
attention (every query head shares one key head and one value head). The defaults (d_model 64,
2 layers, 4 heads, feed-forward 128, context 256 bytes: about 90k parameters; the training
configs' shape, with a context that leaves a 64-token answer 192 bytes of prompt) are chosen
for speed: RLCR on two cores runs many episodes of several agents for tens of turns each, so a
decode step over a batch of a thousand agents must take milliseconds, not seconds. Measured on
this machine (bench/policy_speed.py, batch 1,024), the previous default (d_model 96,
feed-forward 256) samples about a third fewer tokens per second, and d_model 128 costs a
quarter more per token than that; multi-query attention is what makes large batches pay at
all: a decode step reads every row's whole key/value cache, and one shared key/value head makes
that cache (and its memory traffic) four times smaller.

One network, two ways to run it: ``hidden`` over whole right-padded sequences with a causal mask
in float32 (what the learner differentiates), and ``policy.tiny.invariant.SamplingNet``, which
samples with the same weights so that a request's tokens and logprobs are the same bits in any
batch (each prompt prefilled on its own in float32, then one new token per row for all rows at
once with every product exact in fixed point). The tests hold the two to the same function, to
about 1e-6.
"""

from __future__ import annotations

import math

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

    def hidden(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        select: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Final hidden states of right-padded sequences ``ids`` (batch, n) at positions ``pos``,
        with causal attention within them (pads come last, so no real token sees one).

        With ``select`` (rows, columns), only those N cells are wanted: the result is (N,
        d_model), and the final block's projection and feed-forward run there alone (what the
        learner scores: the positions that predict output tokens, a fraction of each sequence).
        Otherwise the result is (batch, n, d_model).
        """
        b, n = ids.shape
        heads, dh = self.cfg.n_heads, self.cfg.head_dim
        x = self.tok(ids) + self.pos(pos)
        for i, blk in enumerate(self.blocks):
            q, k, v = blk.qkv_split(x)
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

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits from final hidden states (the head is the tied embedding)."""
        return hidden @ self.tok.weight.T

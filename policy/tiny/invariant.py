"""The tiny network as the sampler runs it: a request's result is the same bits in any batch, on
any x86 CPU, by construction rather than by which kernel a library picks.

Why: float addition is not associative, and a BLAS library picks its kernel, with it the order
in which a product's terms are summed, by the number of rows, by where they lie in memory and by
the instruction set. Measured with torch 2.13's MKL on an AVX2 CPU: one to three rows round
differently from four or more, and under ``MKL_CBWR=COMPATIBLE`` eight or more round differently
from four; on CPUs with AVX-512 a request alone and in a batch differed in the 7th digit of its
logprobs. A last-bit difference in a logit becomes another token sooner or later, so a request's
answer would depend on what shared its batch, and two training runs, which batch requests as the
wall clock falls, would part. Two constructions rule that out:

- **A prompt is prefilled on its own** (``prefill``): the plain float32 network, the learner's
  arithmetic, over that prompt alone. The kernels it calls, their shapes and operands are then
  the same whatever else is in the batch, so their results are too (a kernel given the same
  shapes, data, alignment, instruction set and one thread computes the same thing; torch
  allocates every tensor 64-byte aligned). Its keys and values go to the cache in fixed point.
- **Every sum across a batch is exact** (``step``, ``logits``: one token per row for every row
  at once). ``to_fixed`` writes each row of activations as integers times one power of two
  chosen from that row alone (its largest magnitude), and each weight matrix likewise, keeping
  ``operand_bits`` bits: few enough that every product of two operands and every partial sum of
  a row's products is an integer below 2**53, which float64 holds exactly. A float64 matrix
  product of such operands is then the same number whatever order, blocking, kernel,
  instruction set, alignment or thread count computes it; it is scaled back by a power of two
  (exact) and rounded once. Linear layers, attention scores (queries by keys) and attention
  outputs (weights by values) are computed so; so is attention's softmax, whose exponentials
  are put in fixed point and summed exactly, so a row may attend over any number of masked
  columns (each adds exactly 0), and its max is exact in any order. After a layer norm no row
  needs measuring: the norm bounds every output (``FixedLinear``); after attention the row's
  largest value bounds its output.

What remains is row by row or element by element. Layer norm over ``d_model``, and the
sampler's softmax, log-softmax and cumulative sum over the vocabulary, are ATen kernels that
reduce each row on its own in an order set by the row's length, which the model fixes. An add,
a multiply, a division, a rounding or a conversion rounds each element once, the same in a
vector lane or a scalar loop, and a product by a power of two is exact, so fusing it with an add
(FMA) changes nothing. Exponentials and GELU are vectorised kernels whose last partial vector
may take another path, so each runs on a tensor whose size is a multiple of 64 (attention spans
a multiple of 64 columns; the feed-forward width is padded with zero units, GELU(0) = 0), which
has no partial vector; and sampling runs one intra-op thread (``policy.tiny.adapter``), so no
kernel cuts a tensor at a place that depends on its size.

The price is precision and speed: operands keep 21 to 24 significant bits (float32 has 24), so
a logit moves by about 1e-6 of its scale against the plain float32 network that the learner
differentiates (``TinyTransformer.hidden``); it recomputes sampled logprobs to about 1e-6,
which the importance ratio absorbs. ``bench/sampler_cost.py`` measures the speed
against the plain float32 sampler this replaced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from policy.fixed import TINY as _TINY
from policy.fixed import WHOLE_VECTORS, operand_bits, to_fixed
from policy.fixed import round_up as _round_up
from policy.tiny.model import Block, TinyTransformer

_LN2 = math.log(2.0)
#: A key/value cache: per layer, float64 integers (batch, 2, positions, head_dim) and their
#: powers of two (batch, 2, positions); [:, 0] keys, [:, 1] values. Zeros wherever nothing was
#: written: such a column adds exactly nothing.
Cache = list[tuple[torch.Tensor, torch.Tensor]]


class FixedLinear:
    """``x @ weight.T + bias`` with the product computed exactly (module docstring), or with
    ``norm`` the same of ``norm(x)``; float64 in and out.

    ``x`` is put in fixed point row by row (``to_fixed``), the weights with one power of two.
    After a layer norm no row needs measuring: every output of ``norm`` obeys ``|y_i| <=
    sqrt(d - 1) * |gain_i| + |bias_i|`` (a standardised entry of d is at most sqrt(d - 1)), so
    input i gets the fixed power of two above that bound, folded into the weights (a power of
    two: exact), which then take one power per output. ``pad_out`` zero output units,
    ``pad_in`` zero input units (the feed-forward padding)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        norm: nn.LayerNorm | None = None,
        pad_out: int = 0,
        pad_in: int = 0,
    ) -> None:
        w = F.pad(weight.detach().double(), (0, pad_in, 0, pad_out))
        n, self.k = w.shape
        self.bits = operand_bits(self.k)
        self.bias = None if bias is None else F.pad(bias.detach().double(), (0, pad_out))
        self.norm: tuple[tuple[int], torch.Tensor, torch.Tensor, float] | None = None
        if norm is None:
            m, s = to_fixed(w.reshape(1, -1), self.bits)
            self.weight = m.view(n, self.k).T.contiguous()  # (in, out) float64 integers
            self.scale: torch.Tensor | float = float(s)  # one power of two for the matrix
            return
        gain, shift = norm.weight.detach().double(), norm.bias.detach().double()
        self.norm = (tuple(norm.normalized_shape), gain, shift, norm.eps)  # type: ignore[assignment]
        bound = ((self.k - 1) ** 0.5 * gain.abs() + shift.abs()).mul_(1 + 2**-10)
        mantissa, _ = torch.frexp(bound.clamp_min_(_TINY))
        self.inverse = mantissa.div_(bound).mul_(2.0**self.bits)  # 2**bits over the power
        m, s = to_fixed(w / self.inverse, self.bits)  # the inputs' powers folded in, exactly
        self.weight = m.T.contiguous()
        self.scale = s.T.contiguous()  # (1, out): one power per output

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is None:
            return self.on_fixed(*to_fixed(x, self.bits))
        x = F.layer_norm(x, *self.norm)
        return self.on_fixed(x.mul_(self.inverse).round_(), None)

    def on_fixed(
        self, m: torch.Tensor, s: torch.Tensor | None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The layer's output for input ``m * s``: ``m`` float64 integers of at most ``bits``
        bits (..., in), ``s`` powers of two (..., 1), or None for the layer norm's own."""
        y = torch.mm(m.view(-1, self.k), self.weight).view(*m.shape[:-1], -1)
        if s is None:  # only a layer with a norm passes None, and its scale is per output
            assert isinstance(self.scale, torch.Tensor)
            scale = self.scale
        else:
            scale = s.mul_(self.scale)
        # bias + y * scale: the product is by powers of two (exact): one rounding.
        if self.bias is None:
            return torch.mul(y, scale, out=out)
        return torch.addcmul(self.bias, y, scale, out=out)


class FixedBlock:
    """One transformer block with fixed-point products (``policy.tiny.model.Block``)."""

    def __init__(self, blk: Block, heads: int) -> None:
        self.heads = heads
        self.head_dim = (blk.qkv.out_features - blk.proj.in_features) // 2
        # Queries pre-scaled by 1 / sqrt(head_dim), so scores need no scaling of their own.
        scale = torch.ones(blk.qkv.out_features, dtype=torch.float64)
        scale[: blk.proj.in_features] = self.head_dim**-0.5
        self.qkv = FixedLinear(
            blk.qkv.weight.double() * scale[:, None], blk.qkv.bias.double() * scale, norm=blk.ln1
        )
        self.proj = FixedLinear(blk.proj.weight, blk.proj.bias)
        pad = -blk.fc1.out_features % WHOLE_VECTORS
        self.fc1 = FixedLinear(blk.fc1.weight, blk.fc1.bias, norm=blk.ln2, pad_out=pad)
        self.fc2 = FixedLinear(blk.fc2.weight, blk.fc2.bias, pad_in=pad)

    def finish(self, x: torch.Tensor, attended: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The rest of the block, for attention output ``attended * scale`` (fixed point, of at
        most ``proj.bits`` bits): output projection, residual, feed-forward, residual."""
        x = self.proj.on_fixed(attended, scale).add_(x)
        return self.fc2(F.gelu(self.fc1(x))).add_(x)


class SamplingNet:
    """A snapshot of a ``TinyTransformer``'s weights, prepared for sampling (module docstring).

    ``prefill`` runs each prompt on its own and makes the key/value cache, ``step`` adds one
    token per row, ``logits`` applies the final layer norm and the head. Build one per batch
    while the weights cannot change: the prefill runs ``net`` itself."""

    @torch.no_grad()
    def __init__(self, net: TinyTransformer) -> None:
        cfg = self.cfg = net.cfg
        self.net = net
        self.tok, self.pos = net.tok.weight.detach().double(), net.pos.weight.detach().double()
        self.blocks = [FixedBlock(blk, cfg.n_heads) for blk in net.layers]
        self.head = FixedLinear(net.tok.weight, None, norm=net.ln_f)
        self.max_columns = _round_up(cfg.context, WHOLE_VECTORS)
        # Queries, keys, values and attention weights share one width: it suits both products.
        self.bits = operand_bits(max(cfg.head_dim, self.max_columns))
        # Exponentials in fixed point: 2**exp_bits for the largest, a row's sum below 2**53.
        self.exp_bits = 52 - (self.max_columns - 1).bit_length()
        self.proj_bits = self.blocks[0].proj.bits

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits (float32) from hidden states (the final layer norm, then the head:
        the tied embedding)."""
        return self.head(hidden).float()

    def prefill(self, prompts: Sequence[list[int]], room: int) -> tuple[torch.Tensor, Cache]:
        """Each prompt through the float32 network on its own, with causal attention (module
        docstring). Returns the hidden states at the prompts' last positions (batch, d_model),
        before the final layer norm (``logits`` applies it), and a cache with every layer's
        keys and values in fixed point (a power of two per position) and room for ``room``
        more tokens per row."""
        b, dh = len(prompts), self.cfg.head_dim
        columns = _round_up(max(len(p) for p in prompts) + room, WHOLE_VECTORS)
        raw = torch.zeros((self.cfg.n_layers, b, 2, columns, dh))
        h = torch.stack(
            [self._prefill_one(torch.tensor(p), raw[:, r]) for r, p in enumerate(prompts)]
        )
        cache = []
        for layer in raw:  # row by row, position by position: one call for the batch
            m, s = to_fixed(layer, self.bits)
            cache.append((m, s[..., 0]))
        return h.double(), cache

    def _prefill_one(self, ids: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        """One prompt (n,) through the float32 network; per layer its keys and values to
        ``raw`` (layers, 2, columns, head_dim); returns the last position's hidden state. The
        final block runs its queries, projection and feed-forward there alone."""
        n = ids.shape[0]
        heads, dh = self.cfg.n_heads, self.cfg.head_dim
        x = self.net.tok(ids) + self.net.pos(torch.arange(n))
        for i, blk in enumerate(self.net.layers):
            q, k, v = blk.qkv_split(x)
            raw[i, 0, :n], raw[i, 1, :n] = k, v
            keys, values = k[None, None], v[None, None]
            if i == len(self.net.layers) - 1:
                a = F.scaled_dot_product_attention(
                    q[-1].view(1, heads, 1, dh), keys, values, enable_gqa=True
                )
                return blk.finish(x[-1], a.reshape(-1))
            a = F.scaled_dot_product_attention(
                q.view(1, n, heads, dh).transpose(1, 2),
                keys,
                values,
                is_causal=True,
                enable_gqa=True,
            )
            x = blk.finish(x, a.transpose(1, 2).reshape(n, -1))
        raise AssertionError("unreachable: the last block returns")

    def step(self, ids: torch.Tensor, pos: torch.Tensor, cache: Cache) -> torch.Tensor:
        """One new token per row: ``ids`` and ``pos`` are (batch,); row r's token goes to
        cache column ``pos[r]`` and attends to columns ``0..pos[r]`` (over whole vectors of
        columns, those after ``pos[r]`` masked). Returns the hidden states (batch, d_model)
        before the final layer norm."""
        b = ids.shape[0]
        heads, dh = self.cfg.n_heads, self.cfg.head_dim
        w = min(cache[0][0].shape[2], _round_up(int(pos.max()) + 1, WHOLE_VECTORS))
        hide = _hide_after(pos, w)
        rows, pair, column = torch.arange(b)[:, None], torch.arange(2)[None, :], pos[:, None]
        x = self.tok[ids] + self.pos[pos]
        for blk, (ints, scales) in zip(self.blocks, cache, strict=True):
            m, s = to_fixed(blk.qkv(x).view(b, heads + 2, dh), self.bits)
            ints[rows, pair, column], scales[rows, pair, column] = m[:, heads:], s[:, heads:, 0]
            a, scale = self._attend(
                m[:, :heads], s[:, :heads], ints[:, :, :w], scales[:, :, :w], hide
            )
            x = blk.finish(x, a.view(b, -1), scale.view(b, 1))
        return x

    def _attend(
        self,
        qm: torch.Tensor,
        qs: torch.Tensor,
        ints: torch.Tensor,
        scales: torch.Tensor,
        hide: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of fixed-point queries ``qm`` (batch, R, head_dim) with powers ``qs``
        (batch, R, 1), already divided by ``sqrt(head_dim)``, over the cache's ``ints`` (batch,
        2, w, head_dim) with powers ``scales`` (batch, 2, w), plus the additive bias ``hide``
        (batch, 1, w; -1e30 hides a column). Returns the output in fixed point for the output
        projection: integers (batch, R, head_dim) and one power of two per row (batch, 1, 1).

        Every sum is exact (module docstring), every scale a function of one row:

        - scores: the integer product of queries and keys times both powers (exact), plus
          ``hide``, rounded to float32;
        - weights: ``exp(score - row max)`` in fixed point with ``2**exp_bits`` for the largest,
          summed exactly; each divided by the sum and multiplied by its value's power over the
          row's largest value power (at most 1) is put in fixed point with ``2**bits`` for 1;
        - output: the integer product of weights and values (exact) over ``2**(2 * bits -
          proj_bits)``, rounded: a convex combination of values is no larger than the largest,
          at most ``2**bits`` times the largest value power, so this has at most ``proj_bits``
          bits, with that power over ``2**(proj_bits - bits)`` as its own."""
        keys, values = ints[:, 0], ints[:, 1]
        kscale, vscale = scales[:, None, 0], scales[:, None, 1]  # (batch, 1, w)
        scores = torch.bmm(qm, keys.transpose(1, 2))
        scores = torch.addcmul(hide, scores, qs * kscale, out=torch.empty(scores.shape))
        # Below -64, exp(.) rounds to 0 anyway; clamping spares exp the slow path of results
        # below float32's normal range (hidden columns sit at -1e30).
        shift = scores.amax(dim=-1, keepdim=True).sub_(self.exp_bits * _LN2)
        e = scores.sub_(shift).clamp_min_(-64.0).exp_().round_()  # integers: exact in float32
        total = e.sum(dim=-1, keepdim=True, dtype=torch.float64)  # exact
        top = vscale.amax(dim=-1, keepdim=True)
        weights = torch.mul(e, vscale / top).mul_(total.reciprocal_().mul_(2.0**self.bits))
        out = torch.bmm(weights.round_(), values)
        out = out.mul_(2.0 ** (self.proj_bits - 2 * self.bits)).round_()
        return out, top.mul_(2.0 ** (self.bits - self.proj_bits))


def _hide_after(last: torch.Tensor, width: int) -> torch.Tensor:
    """An additive attention bias (batch, 1, width): 0 at columns ``<= last[r]``, -1e30 after
    (finite, so a hidden column adds exactly 0 weight and never a NaN)."""
    hidden = torch.arange(width)[None, :] > last[:, None]
    return hidden.to(torch.float32).mul_(-1e30)[:, None, :]

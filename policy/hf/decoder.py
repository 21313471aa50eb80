"""Batched decoding of a Hugging Face causal LM that is batch-invariant by construction.

The in-process sampler (:mod:`policy.hf.policy`) decodes a batch as a batch: one forward per
step over every live request. A request must still get the same tokens and logprobs alone, in
any batch, at any position and in a replay whose batches differ, because training batches
requests as the (simulated) instant falls and a replay batches them otherwise. A plain float32
forward cannot promise that: a BLAS library sums a product's terms in an order it picks by the
number of rows (``tests/support/batch_probe.py`` shows rows that round differently at batch 1,
4 and 8 on this very CPU). Two constructions make the promise:

- **A prompt is prefilled alone**, in the model's own float32 (or bfloat16) arithmetic, with
  shape ``[1, its own length]`` on top of the shared prompt head's keys and values
  (:meth:`FixedDecoder.start`): no other request enters a kernel it runs. Its
  next-token logits give the first output token; its keys and values go to the cache in fixed
  point.
- **Every decode step sums exactly** (:class:`FixedDecoder`): every sum that crosses a batch
  (the linear layers, attention's scores, softmax total and weighted values, the RMS norms'
  sums of squares) is of integers below ``2**53`` in float64 (:mod:`policy.fixed`), so it is the
  same number in any order, blocking, kernel, instruction set or thread count. Everything else
  is element by element (rotary embedding from a table of the model's positions, residual adds,
  SiLU on a width padded to whole vectors, IEEE square root and division), or row by row over
  the vocabulary on a ``[1, vocab]`` tensor of the row's own (mask, log-softmax, the draw).

So a request's result is a function of the request, the weights and the machine, not of its
neighbours: ``tests/policy/test_hf_batched.py`` compares bytes across batches of 1 to 257, a
reversed batch and every position of batches 1 to 8, under the kernel settings the probe forces.

Under LoRA (peft's layers, whose ``.weight`` is the base weight alone) a decoder reads the base
weights and the adapters apart: the base matrices, built once (:class:`Base`), serve every
version, and each version adds its adapters' two exact products (:class:`_LowRank`), so a
served version costs its adapters, not a copy of the model.

Supported: the Llama family as ``transformers`` implements it (``llama``, ``qwen2``,
``mistral``: RMS norms, rotary embeddings without scaling, grouped-query attention, SiLU-gated
feed-forward, optional projection biases, tied or separate output head). Another architecture
decodes each request on its own (:class:`AloneDecoder`, invariant because nothing is shared),
as every model did before.

The price is precision: each row is rounded to 16 to 24 bits below its own largest entry
(:func:`policy.fixed.operand_bits`: fewer for a wider layer or a longer context), so a decode
step's logits differ a little from the float32 network's, more for a model whose activations
have large outlier channels; the learner's recomputed logprobs absorb that in the importance
ratio (1 within 1e-4 on-policy, ``tests/policy/test_hf_batched.py``). The bits and the
differences measured for given models, and the cost (float64 products against float32's on a
CPU, the whole against ``transformers``' ``generate``, by ``bench/hf_batched.py``), are in
``bench/results/hf_batched/README.md``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from policy.fixed import (
    WHOLE_VECTORS,
    operand_bits,
    round_up,
    rounded,
    rounded_and_fixed,
    to_fixed,
)
from policy.hf.cache import cache_pairs, new_cache

#: Model types whose decoder layers :class:`FixedDecoder` implements.
LLAMA_FAMILY = ("llama", "qwen2", "mistral")
_LN2 = math.log(2.0)
#: A batch's cache is compacted once at most this share of its rows is still decoding.
COMPACT = 0.75
#: A decode step's head computes only the tokens the grammar allows some row when they are at
#: most this share of the vocabulary (the head is SmolLM2-135M's largest product: 49,152
#: outputs; gathering its columns costs more per column than the whole product does).
HEAD_SHARE = 0.25

#: Keys and values of one layer for one request, as a model's cache holds them:
#: ``[1, kv_heads, positions, head_dim]`` each.
Pair = tuple[torch.Tensor, torch.Tensor]


def unsupported(causal: Any) -> str | None:
    """Why :class:`FixedDecoder` cannot run this model (None when it can)."""
    config = causal.config
    kind = getattr(config, "model_type", None)
    if kind not in LLAMA_FAMILY:
        return f"model_type {kind!r} is not one of {LLAMA_FAMILY}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (the Llama family's is 'silu')"
    rope = getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        return f"rope scaling {rope!r}"
    if getattr(config, "use_sliding_window", False) or (
        kind == "mistral" and getattr(config, "sliding_window", None)
    ):
        return "sliding-window attention"
    if not hasattr(causal, "model") or not hasattr(causal.model, "rotary_emb"):
        return "no decoder body with a rotary embedding at .model"
    head = causal.get_output_embeddings()
    if hasattr(head, "base_layer"):
        return "LoRA adapters on the output head"
    for name, module in causal.named_modules():
        if getattr(module, "lora_embedding_A", None):
            return f"{name}: LoRA adapters on an embedding"
        if hasattr(module, "lora_A") and (why := _variant(module)):
            return f"{name}: {why}"
    return None


def _variant(proj: Any) -> str | None:
    """Why a peft LoRA layer is not ``base(x) + scale * B(A(x))`` (None when it is)."""
    for name in proj.active_adapters:
        if name not in proj.lora_A:
            continue
        if name in getattr(proj, "lora_variant", {}) or proj.use_dora.get(name, False):
            return f"a LoRA variant (DoRA or another) in adapter {name!r}"
        if proj.lora_B[name].bias is not None:
            return f"a LoRA bias in adapter {name!r}"
        if not isinstance(proj.lora_dropout[name], torch.nn.Identity) and proj.training:
            return f"LoRA dropout in training mode in adapter {name!r}"
    return None


def _parts(proj: Any) -> tuple[torch.Tensor, Any, list[tuple[torch.Tensor, torch.Tensor, float]]]:
    """A projection's base weight and bias, and its active LoRA adapters ``(A, B, scale)``:
    none for a plain ``nn.Linear``, nor for a peft layer whose adapters are disabled or merged
    into its base weight already."""
    base = getattr(proj, "base_layer", proj)
    if base is proj or proj.disable_adapters or proj.merged:
        return base.weight, base.bias, []
    adapters = [
        (proj.lora_A[n].weight, proj.lora_B[n].weight, float(proj.scaling[n]))
        for n in proj.active_adapters
        if n in proj.lora_A
    ]
    return base.weight, base.bias, adapters


class _Linear:
    """``x @ W.T + b`` with the product exact: ``x`` rounded row by row, ``W`` output by output
    (:func:`policy.fixed.rounded`); float64 in and out. ``pad_in`` zero input units.

    With ``norm`` (an RMS norm's gain and epsilon) it is the same of ``norm(x)``, in one pass:
    the gain is folded into the weights (a float32 times a float32 is exact in float64), the
    row's sum of squares is exact (its rounded entries squared: the operands' bits leave room for
    ``in`` squares below ``2**53`` times the row's power squared), and the exact product is
    divided by the row's rms afterwards (IEEE square root and division: the same in a vector
    lane or a scalar loop)."""

    def __init__(
        self,
        weights: Sequence[torch.Tensor],
        biases: Sequence[Any],
        pad_in: int = 0,
        norm: tuple[torch.Tensor, float] | None = None,
    ) -> None:
        # One float64 matrix at a time, changed in place: a transient the size of the largest
        # matrix (the head's, 0.21 GiB for SmolLM2-135M) costs its size again in the heap.
        w = torch.cat([x.detach() for x in weights]).double()
        if norm is not None:
            w.mul_(norm[0].detach().double()[None, :])
        if pad_in:
            w = F.pad(w, (0, pad_in))
        self.bits = operand_bits(w.shape[1])
        self.eps = None if norm is None else float(norm[1])
        # a power of two per output; kept [out, in], as nn.Linear keeps it: MKL's float64
        # product of a few rows with it is 0.7-1.0x the [in, out] one at SmolLM2's shapes
        self.weight = rounded(w, self.bits)
        del w
        parts = [
            b.detach().double()
            if b is not None
            else torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
            for x, b in zip(weights, biases, strict=True)
        ]
        self.bias = torch.cat(parts) if any(b is not None for b in biases) else None

    def to(self, device: torch.device) -> _Linear:
        self.weight = self.weight.to(device)
        self.bias = None if self.bias is None else self.bias.to(device)
        return self

    def __call__(
        self,
        x: torch.Tensor,
        lora: _LowRank | None = None,
        outputs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The outputs for ``x``; with ``outputs`` (indices) those alone, the same bits as in the
        whole: each is an exact sum of its own products, then the same element-by-element
        steps. (A subset and adapters do not meet: only the head takes a subset, and a head
        with adapters decodes alone, :func:`unsupported`.)"""
        x = rounded(x, self.bits)
        weight, bias = self.weight, self.bias
        if outputs is not None:
            assert lora is None, "a subset of a linear with adapters"
            weight = weight.index_select(0, outputs)
            bias = None if bias is None else bias[outputs]
        y = torch.mm(x, weight.T)  # exact: each term an integer times the two rows' powers
        if lora is not None:  # + scale * B A x: two more exact products, one rounding each
            lora.add_to(y, x)
        if self.eps is not None:  # times 1 / rms: one rounding
            squares = torch.mul(x, x).sum(-1, keepdim=True)  # exact, for the same reason
            y.div_(torch.sqrt(squares.div_(x.shape[-1]).add_(self.eps)))
        return y if bias is None else y.add_(bias)


class _LowRank:
    """LoRA's ``scale * B @ (A @ x)`` beside a :class:`_Linear`'s outputs, each product exact:
    every ``A`` (its rows times the norm's gain where the linear folds one) rounded row by row
    with the linear's bits, so the linear's rounded ``x`` serves; each adapter's ``A x``
    rounded row by row again, and its ``scale * B`` output by output, to the bits of a sum of
    ``rank`` terms. Adding the product to the linear's is one rounding, element by element.
    A version's adapters are all a served version adds to the base's float64 matrices."""

    def __init__(
        self,
        parts: Sequence[tuple[int, list[tuple[torch.Tensor, torch.Tensor, float]]]],
        bits: int,
        pad_in: int,
        gain: torch.Tensor | None,
        device: torch.device,
    ) -> None:
        downs = []  # every adapter's A, stacked: one product for all
        self.ups: list[tuple[slice, slice, int, torch.Tensor]] = []  # (A x's columns, outputs,
        rank, out = 0, 0  # bits, scale * B) an adapter
        for width, adapters in parts:  # the linear's output blocks, in order: (width, adapters)
            for a, b, scale in adapters:
                r, bits_r = a.shape[0], operand_bits(a.shape[0])
                downs.append(a.detach().double())
                up = rounded(b.detach().double().mul_(scale), bits_r).to(device)  # [out, r]
                self.ups.append((slice(rank, rank + r), slice(out, out + width), bits_r, up))
                rank += r
            out += width
        down = torch.cat(downs)
        if gain is not None:
            down.mul_(gain.detach().double()[None, :])
        self.down = rounded(F.pad(down, (0, pad_in)), bits).to(device)  # [ranks, in]

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        """``y += scale * B A x`` for ``x`` already rounded with the linear's bits."""
        t = torch.mm(x, self.down.T)  # exact, as the linear's own product
        for cols, outs, bits, up in self.ups:
            y[:, outs].add_(torch.mm(rounded(t[:, cols], bits), up.T))  # exact, then one rounding

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.down, *(u for *_, u in self.ups)))


def _projections(layer: Any) -> tuple[Any, ...]:
    """A decoder layer's seven projections: q, k, v, o, gate, up, down."""
    attn, mlp = layer.self_attn, layer.mlp
    return (
        attn.q_proj,
        attn.k_proj,
        attn.v_proj,
        attn.o_proj,
        mlp.gate_proj,
        mlp.up_proj,
        mlp.down_proj,
    )


class _Layer:
    """A decoder layer's four exact-sum linears over its base weights (under LoRA: the weights
    that never train, shared by every version's decoder)."""

    def __init__(self, layer: Any, pad: int, device: torch.device) -> None:
        before_attn, before_mlp = _norms(layer)
        q, k, v, o, gate, up, down = (_parts(p) for p in _projections(layer))
        self.qkv = _Linear([q[0], k[0], v[0]], [q[1], k[1], v[1]], norm=before_attn).to(device)
        self.o = _Linear([o[0]], [o[1]]).to(device)
        # gate and up padded with zero units to whole vectors for SiLU (silu(0) * 0 = 0),
        # down with as many zero inputs
        zeros = gate[0].new_zeros(pad, gate[0].shape[1])
        self.gate_up = _Linear(
            [gate[0], zeros, up[0], zeros],
            [gate[1], _zero_bias(gate[1], pad), up[1], _zero_bias(up[1], pad)],
            norm=before_mlp,
        ).to(device)
        self.down = _Linear([down[0]], [down[1]], pad_in=pad).to(device)
        self.scaling = float(layer.self_attn.scaling)


class _Adapters:
    """A decoder layer's LoRA adapters, one :class:`_LowRank` a linear (None where it has none,
    as every linear of a model without LoRA): what one version's weights add to the shared
    :class:`_Layer`."""

    def __init__(self, layer: Any, base: _Layer, pad: int, device: torch.device) -> None:
        (g_attn, _), (g_mlp, _) = _norms(layer)
        q, k, v, o, gate, up, down = (_parts(p) for p in _projections(layer))

        def low_rank(
            blocks: list[tuple[int, list]], linear: _Linear, gain: Any, pad_in: int = 0
        ) -> _LowRank | None:
            if not any(adapters for _, adapters in blocks):
                return None
            return _LowRank(blocks, linear.bits, pad_in, gain, device)

        width = gate[0].shape[0]
        self.qkv = low_rank([(p[0].shape[0], p[2]) for p in (q, k, v)], base.qkv, g_attn)
        self.o = low_rank([(o[0].shape[0], o[2])], base.o, None)
        blocks = [(width, gate[2]), (pad, []), (width, up[2]), (pad, [])]
        self.gate_up = low_rank(blocks, base.gate_up, g_mlp)
        self.down = low_rank([(down[0].shape[0], down[2])], base.down, None, pad)

    def nbytes(self) -> int:
        return sum(x.nbytes() for x in (self.qkv, self.o, self.gate_up, self.down) if x)


def _norms(layer: Any) -> tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]]:
    before_attn, before_mlp = (
        (n.weight, float(n.variance_epsilon))
        for n in (layer.input_layernorm, layer.post_attention_layernorm)
    )
    return before_attn, before_mlp


def _zero_bias(bias: Any, n: int) -> torch.Tensor | None:
    return None if bias is None else torch.zeros(n, dtype=bias.dtype, device=bias.device)


class Base:
    """The float64 matrices a decoder builds from a model's base weights, the rotary table, and
    the tensors they came from. Under LoRA every served version's copy of the model holds the
    very same base tensors (``HFModel.copy``: they never train), so one ``Base`` serves every
    version's decoder and a version adds only its adapters (:class:`_LowRank`): SmolLM2-135M's
    base matrices are 0.8 GiB, a version's rank-8 adapters 19 MiB."""

    @torch.no_grad()
    def __init__(self, causal: Any, pad: int, device: torch.device) -> None:
        body = causal.model
        self.sources = _sources(causal)
        # the embedding is the model's own float32 tensor (a row is made float64 exactly when
        # it is read): a float64 copy would hold the vocabulary twice over for nothing
        self.embed = body.embed_tokens.weight.detach()
        self.layers = [_Layer(layer, pad, device) for layer in body.layers]
        final = (body.norm.weight, float(body.norm.variance_epsilon))
        self.head = _Linear([causal.get_output_embeddings().weight], [None], norm=final)
        self.head.to(device)
        # The rotary embedding of every position, once: the model's own cos and sin, a table
        # indexed by position (its prefill computes the same values for its own positions, up
        # to float32 rounding of the position times the frequency).
        context = int(causal.config.max_position_embeddings)
        positions = torch.arange(context, device=device)[None]
        probe = torch.zeros(1, dtype=torch.float32, device=device)
        cos, sin = body.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0].double(), sin[0].double()  # (context, head_dim)
        self.sin[:, : self.sin.shape[1] // 2].neg_()  # rotate_half's sign (_rotate)

    def serves(self, causal: Any) -> bool:
        """Whether ``causal``'s base weights are the very tensors this was built from."""
        mine = _sources(causal)
        return len(mine) == len(self.sources) and all(
            a is b for a, b in zip(mine, self.sources, strict=True)
        )

    def nbytes(self) -> int:
        """The bytes of the tensors it holds (not the embedding: the model's own)."""
        linears = [
            x for layer in self.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down)
        ]
        tensors = [self.cos, self.sin, self.head.weight, self.head.bias]
        tensors += [t for lin in linears for t in (lin.weight, lin.bias)]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _sources(causal: Any) -> list[Any]:
    """Every base tensor a :class:`Base` reads, in order."""
    body = causal.model
    out: list[Any] = [body.embed_tokens.weight, body.norm.weight]
    out.append(causal.get_output_embeddings().weight)
    for layer in body.layers:
        out += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        for proj in _projections(layer):
            out += _parts(proj)[:2]
    return out


class SharedBase:
    """The batch-invariant decoder's base matrices (:class:`Base`) of one set of
    base weights, built by the first decoder that needs them and handed to every later one:
    under LoRA every served version's copy holds the same base tensors (:meth:`HFModel.copy`),
    so a version's decoder adds only its adapters. Thread-safe: sampling threads build
    decoders."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base: Base | None = None

    def decoder(self, causal: Any, cache_arg: str) -> FixedDecoder:
        """A ``FixedDecoder`` of ``causal`` on the shared base (built now if there is none)."""
        with self._lock:
            decoder = FixedDecoder(causal, cache_arg, self._base)
            self._base = decoder.base
            return decoder


class FixedDecoder:
    """A Llama-family model's decode steps with exact sums (module docstring), over a batch of
    rows whose keys and values it keeps in fixed point. Built from the model's weights as they
    are: build a new one after the weights change."""

    @torch.no_grad()
    def __init__(self, causal: Any, cache_arg: str, base: Base | None = None) -> None:
        """``causal`` prefills, says the shapes, and gives the weights; its LoRA adapters (peft
        layers', whose ``.weight`` is the base weight alone) are decoded beside the base
        matrices, which come from ``base`` when given (built from these very tensors: a
        ValueError otherwise) and are built here when not."""
        why = unsupported(causal)
        if why is not None:
            raise ValueError(f"FixedDecoder: {why}")
        self.causal, self.cache_arg = causal, cache_arg
        self.alone = AloneDecoder(causal, cache_arg)  # the prefill: each prompt on its own
        config = causal.config
        self.device = next(causal.parameters()).device
        self.q_heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.q_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.q_heads)
        self.hidden = int(config.hidden_size)
        self.context = int(config.max_position_embeddings)
        # Attention sums at most ``context`` columns (rounded to whole vectors): its operands'
        # bits, and the exponentials' scale (a row's sum below 2**53).
        self.max_columns = round_up(self.context, WHOLE_VECTORS)
        self.bits = operand_bits(max(self.head_dim, self.max_columns))
        self.exp_bits = 52 - (self.max_columns - 1).bit_length()
        self.pad = -int(config.intermediate_size) % WHOLE_VECTORS
        self.inter = int(config.intermediate_size) + self.pad
        if base is None:
            base = Base(causal, self.pad, self.device)
        elif not base.serves(causal):
            raise ValueError("FixedDecoder: the base given was built from other weights")
        self.base = base
        self.embed, self.layers, self.head = base.embed, base.layers, base.head
        self.cos, self.sin = base.cos, base.sin
        self.adapters = [
            _Adapters(layer, mine, self.pad, self.device)
            for layer, mine in zip(causal.model.layers, base.layers, strict=True)
        ]

    def nbytes(self) -> int:
        """The bytes of the tensors it holds, its base's included: what the memory guard counts
        (``collective.rl.checks.model_parts``)."""
        return self.base.nbytes() + self.adapter_nbytes()

    def adapter_nbytes(self) -> int:
        """The bytes of its LoRA adapters alone: what a version adds to a shared base."""
        return sum(a.nbytes() for a in self.adapters)

    def start(
        self,
        heads: Sequence[tuple[int, Sequence[Pair]]],
        prompts: Sequence[list[int]],
        rooms: Sequence[int],
    ) -> tuple[_Fixed, torch.Tensor]:
        """A batch to decode, prefilled: row r's prompt ``prompts[r]`` whose first ``heads[r][0]``
        tokens are already in the keys and values ``heads[r][1]`` (per layer, ``[1, kv_heads,
        n, dim]``: the shared prompt head); ``rooms[r]`` more tokens after it (its own budget: a
        batch fits the context whenever each of its requests does).
        Returns the rows and each row's first-token logits (float32 ``[rows, vocab]``).

        Each prompt's rest is prefilled alone, by the model itself in its own dtype (a function
        of the prompt alone: module docstring): on a CPU float32 products cost half of float64's,
        and a prefill is many rows, so this beats one exact-sum pass over the padded batch
        (the two compared: ``bench/results/hf_batched/README.md``)."""
        firsts, pairs = [], []
        for (n, head), prompt in zip(heads, prompts, strict=True):
            rows, logits = self.alone.start([(n, head)], [prompt], [0])
            firsts.append(logits[0])
            pairs.append((len(prompt), cache_pairs(rows.caches[0])))
        fixed = _Fixed(self, pairs, max(len(p) + r for p, r in zip(prompts, rooms, strict=True)))
        return fixed, torch.stack(firsts)

    def attend(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        vm: torch.Tensor,
        vs: torch.Tensor,
        unseen: torch.Tensor,
        scaling: float,
    ) -> torch.Tensor:
        """Attention of one query a row, rounded (:func:`policy.fixed.rounded`, (b, q_heads,
        dim)), over rounded keys (b, kv_heads, w, dim) and values in fixed point (b, kv_heads,
        w, dim) with powers (b, kv_heads, w); ``unseen`` (b, 1, w) marks the columns after each
        row's position. Float64 (b, q_heads * dim). Every sum exact:

        - scores: products of a rounded query and a rounded key (exact: one power each), times
          the model's scaling (one rounding);
        - weights: ``exp(score - max)`` as integers with ``2**exp_bits`` for the largest, summed
          exactly; each divided by the sum, times its value's power over the row's largest
          power (at most 1), as an integer with ``2**bits`` for 1;
        - output: the integer product of weights and values (exact), times that largest power
          over ``2**bits`` (a power of two: exact).

        An unseen column weighs exactly 0, and its power is 0 (nothing is ever written after a
        row's position: :class:`_Fixed`), so it sets no maximum: neither the cache's width nor
        any other row can change a row's numbers."""
        b, h, dim = q.shape
        kv, w = keys.shape[1], keys.shape[2]
        # (b, kv, ...) as (b * kv, ...): views, the cache's slices included
        q = q.reshape(b * kv, h // kv, dim)
        scores = torch.bmm(q, keys.reshape(b * kv, w, dim).transpose(1, 2))  # exact
        scores.mul_(scaling).view(b, h, w).masked_fill_(unseen, -1e30)
        shift = scores.amax(dim=-1, keepdim=True).sub_(self.exp_bits * _LN2)
        e = scores.sub_(shift).clamp_min_(-64.0).exp_().round_()  # integers below 2**exp_bits
        total = e.sum(dim=-1, keepdim=True)  # exact
        vs = vs.reshape(b * kv, 1, w)
        top = vs.amax(dim=-1, keepdim=True)  # (b * kv, 1, 1)
        weights = e.mul_(vs / top).mul_(total.reciprocal_().mul_(2.0**self.bits))
        out = torch.bmm(weights.round_(), vm.reshape(b * kv, w, dim))  # exact
        return out.mul_(top).mul_(2.0**-self.bits).view(b, h * dim)


class _Fixed:
    """The rows of a batch decoded by a :class:`FixedDecoder`: their keys, rounded, and values
    in fixed point (per layer: (rows, kv_heads, width, dim), and the values' integers with
    powers (rows, kv_heads, width); 0 where nothing was written), each row's next position,
    and which rows still decode."""

    def __init__(
        self, net: FixedDecoder, heads: Sequence[tuple[int, Sequence[Pair]]], longest: int
    ) -> None:
        self.net = net
        b = len(heads)
        width = round_up(longest, WHOLE_VECTORS)
        if longest > net.context:
            raise ValueError(f"{longest} positions exceed the model's {net.context}")
        shape = (b, net.kv_heads, width, net.head_dim)
        # Every layer's cache in one tensor, and a row's layers rounded together: each
        # (layer, head, position) vector is a row of its own to policy.fixed, so the numbers are
        # those of rounding layer by layer, in a few ops a row instead of a few per layer (a
        # batch of one spent 3 ms here, against 4 ms a decode step). 0 where nothing is written.
        at_once = (len(net.layers), *shape)
        k = torch.zeros(at_once, dtype=torch.float64, device=net.device)
        m = torch.zeros(at_once, dtype=torch.float64, device=net.device)
        s = torch.zeros(at_once[:-1], dtype=torch.float64, device=net.device)
        for r, (n, pairs) in enumerate(heads):
            if n:
                k[:, r, :, :n] = rounded(torch.stack([x[0, :, :n] for x, _ in pairs]), net.bits)
                mr, sr = to_fixed(torch.stack([v[0, :, :n] for _, v in pairs]), net.bits)
                m[:, r, :, :n], s[:, r, :, :n] = mr, sr[..., 0]
        self.keys: list[torch.Tensor] = list(k.unbind())  # per layer: rounded, by position
        self.values: list[tuple[torch.Tensor, torch.Tensor]] = [  # per layer: ints, powers
            (mi, si) for mi, si in zip(m.unbind(), s.unbind(), strict=True)
        ]
        self.at = [n for n, _ in heads]  # each held row's next position (and on the device:)
        self.pos = torch.tensor(self.at, dtype=torch.long, device=net.device)
        self.live = list(range(b))  # the held rows still decoding, in the caller's order
        self.columns = torch.arange(width, device=net.device)
        self._index(b)

    def _index(self, b: int) -> None:
        self.rows = torch.arange(b, device=self.net.device)[:, None]  # (b, 1)
        self.heads = torch.arange(self.net.kv_heads, device=self.net.device)[None]  # (1, kv)

    def keep(self, rows: Sequence[int]) -> None:
        """Drop every live row but ``rows`` (indices into the live rows, in order). The cache
        is compacted only once at most ``COMPACT`` of its rows live: until then a finished row
        rides along (its position frozen, its outputs unread), which costs a little arithmetic
        and saves copying every layer's cache at every finish. Either way no live row's numbers
        change: rows never mix."""
        self.live = [self.live[j] for j in rows]
        if len(self.live) > COMPACT * len(self.pos):
            return
        at = torch.tensor(self.live, dtype=torch.long, device=self.net.device)
        self.keys = [k[at] for k in self.keys]
        self.values = [(m[at], s[at]) for m, s in self.values]
        self.pos = self.pos[at]
        self.at = [self.at[r] for r in self.live]
        self.live = list(range(len(self.live)))
        self._index(len(self.live))

    @torch.inference_mode()
    def step(self, tokens: Sequence[int], allowed: torch.Tensor | None = None) -> torch.Tensor:
        """One token per live row, at its next position; the next-token logits, float32
        ``[live rows, vocab]``. A finished row that rides along gets token 0 at its frozen
        position: written into its own row's cache, never read.

        ``allowed`` (booleans ``[live rows, vocab]``: the grammar's masks for the next token)
        lets the head compute only the tokens some live row may take, when they are at most
        ``HEAD_SHARE`` of the vocabulary; every other logit is 0, and the sampler forbids
        those tokens anyway. A computed logit is the same bits either way
        (:class:`_Linear`'s ``outputs``), and which are computed changes no row's distribution, so
        the answers are those of the whole head (tested)."""
        net = self.net
        b, h, kv, dim = len(self.pos), net.q_heads, net.kv_heads, net.head_dim
        held = [0] * b
        for row, token in zip(self.live, tokens, strict=True):
            held[row] = token
        pos = self.pos
        width = self.keys[0].shape[2]
        if max(self.at) >= width:
            raise ValueError("FixedDecoder: a row ran past the room it was given")
        w = min(width, round_up(max(self.at) + 1, WHOLE_VECTORS))
        unseen = (self.columns[:w] > pos[:, None])[:, None]  # (b, 1, w)
        x = net.embed[torch.tensor(held, device=net.device)].double()
        cos, sin = net.cos[pos][:, None], net.sin[pos][:, None]  # (b, 1, dim)
        # where each new key and value goes: row r's head j's column pos[r] of a layer's
        # cache, seen as (rows * kv_heads * width, dim)
        into = ((self.rows * kv + self.heads) * width + pos[:, None]).view(-1)
        for layer, lora, keys, (vm, vs) in zip(
            net.layers, net.adapters, self.keys, self.values, strict=True
        ):
            qkv = layer.qkv(x, lora.qkv).view(b, h + 2 * kv, dim)
            qkv[:, : h + kv] = _rotate(qkv[:, : h + kv], cos, sin)
            qk, (m, s) = rounded_and_fixed(qkv, net.bits, h + kv)  # queries, keys | values
            keys.view(-1, dim).index_copy_(0, into, qk[:, h:].reshape(-1, dim))
            vm.view(-1, dim).index_copy_(0, into, m.reshape(-1, dim))
            vs.view(-1).index_copy_(0, into, s.reshape(-1))
            attended = net.attend(
                qk[:, :h], keys[:, :, :w], vm[:, :, :w], vs[:, :, :w], unseen, layer.scaling
            )
            x = layer.o(attended, lora.o).add_(x)
            gate_up = layer.gate_up(x, lora.gate_up)
            silu = F.silu(gate_up[:, : net.inter]).mul_(gate_up[:, net.inter :])
            x = layer.down(silu, lora.down).add_(x)
        live = set(self.live)
        going = [row in live for row in range(b)] if len(self.live) < b else None
        if going is None:
            self.pos = pos + 1
            self.at = [p + 1 for p in self.at]
        else:  # a finished row stays where it is
            self.pos = pos + torch.tensor(going, dtype=torch.long, device=net.device)
            self.at = [p + g for p, g in zip(self.at, going, strict=True)]
            x = x[self.live]
        if allowed is not None and x.device.type == "cpu":  # (a GPU's whole head is cheap)
            union = allowed.any(dim=0).nonzero().flatten()
            if len(union) <= HEAD_SHARE * allowed.shape[1]:
                logits = x.new_zeros(x.shape[0], allowed.shape[1], dtype=torch.float32)
                logits[:, union] = net.head(x, outputs=union).float()
                return logits
        return net.head(x).float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding as ``transformers`` applies it (``x * cos + rotate_half(x) *
    sin``), element by element; ``sin`` carries rotate_half's sign (its first half negated:
    ``-a * b`` and ``a * -b`` are the same float)."""
    return torch.roll(x, x.shape[-1] // 2, dims=-1).mul_(sin).add_(x * cos)


class AloneDecoder:
    """Any other causal LM: each row on its own with the model's own cache, its prompt's rest
    one ``[1, rest]`` forward, then one ``[1, 1]`` forward a step. Invariant because no kernel
    sees two requests; slow."""

    def __init__(self, causal: Any, cache_arg: str) -> None:
        self.causal, self.cache_arg = causal, cache_arg

    def start(
        self,
        heads: Sequence[tuple[int, Sequence[Pair]]],
        prompts: Sequence[list[int]],
        rooms: Sequence[int],
    ) -> tuple[_Alone, torch.Tensor]:
        rows = _Alone(self, [new_cache(self.causal.config, list(pairs)) for _, pairs in heads])
        return rows, rows.forward([p[n:] for (n, _), p in zip(heads, prompts, strict=True)])


class _Alone:
    def __init__(self, net: AloneDecoder, caches: list[Any]) -> None:
        self.net, self.caches = net, caches

    def keep(self, rows: Sequence[int]) -> None:
        self.caches = [self.caches[r] for r in rows]

    def step(self, tokens: Sequence[int], allowed: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward([[t] for t in tokens])  # (the model's whole head: ``allowed`` unused)

    @torch.inference_mode()
    def forward(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        causal = self.net.causal
        device = next(causal.parameters()).device
        out = []
        for row_tokens, cache in zip(tokens, self.caches, strict=True):
            logits = causal(
                input_ids=torch.tensor([list(row_tokens)], device=device),
                use_cache=True,
                logits_to_keep=1,
                **{self.net.cache_arg: cache},
            ).logits
            out.append(logits[0, -1].float())
        return torch.stack(out)

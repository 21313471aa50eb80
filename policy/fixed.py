"""Fixed-point arithmetic whose sums are exact: what makes a batched sampler batch-invariant.

Float addition is not associative, and a BLAS library picks the order in which a product's
terms are summed by the number of rows, their alignment, the instruction set and the threads. So
a row's result in a plain float32 product can depend on what else is in its batch. Here a row
is written as integers times one power of two chosen from that row alone (:func:`to_fixed`),
with few enough bits (:func:`operand_bits`) that every product of two operands, and every
partial sum of a row's products, is an integer below ``2**53``, which float64 holds exactly.
A float64 product of such operands is then the same number whatever order, blocking, kernel or
thread count computes it. Both in-process samplers build on this: the tiny model's
(:mod:`policy.tiny.invariant`) and the Hugging Face one's (:mod:`policy.hf.decoder`).
"""

from __future__ import annotations

import torch

#: A row whose largest magnitude is below this is scaled as if it were this (an all-zero row
#: still gets a finite power of two).
TINY = 2.0**-100
#: Exponentials, GELU and SiLU run on tensors whose size is a multiple of this (a multiple of
#: every vector length times unrolling of x86 kernels: no partial last vector, whose scalar
#: path may round otherwise).
WHOLE_VECTORS = 64


def operand_bits(terms: int) -> int:
    """Bits per integer operand so that a sum of ``terms`` products of two operands of at most
    ``2**bits`` (rounding can reach it) is at most ``2**52``, exact in float64: ``2 * bits +
    bit_length(terms - 1) <= 52`` (and at most 24: a float32 has no more to give)."""
    return min(24, (52 - (terms - 1).bit_length()) // 2)


def _scaled(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` in float64 and each row's ``2**(bits - e)``, where ``2**e`` is the smallest power
    of two above the row's largest magnitude (at least ``TINY``): a maximum, exact in any
    order, and every step after it exact. (``abs().amax()`` rather than ``vector_norm(x,
    inf)``: the same numbers, and five times faster on a batch's caches, where the infinity
    norm takes a generic path.)"""
    if x.dtype != torch.float64:
        x = x.double()
    top = x.abs().amax(dim=-1, keepdim=True).clamp_min_(TINY)
    mantissa, _ = torch.frexp(top)  # top = mantissa * 2**e with mantissa in [0.5, 1)
    return x, mantissa.div_(top).mul_(2.0**bits)  # 2**(bits - e), exactly


def to_fixed(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row (last dimension) of ``x`` as ``(m, s)``: float64 integers ``m`` with
    ``|m| <= 2**bits`` and one power of two ``s`` per row (shape ``(..., 1)``, float64), so that
    ``x == m * s`` to within ``s / 2``. The power is the smallest one above the row's largest
    magnitude, divided by ``2**bits``: a function of the row alone, every step exact but the
    final rounding to an integer."""
    x, inverse = _scaled(x, bits)
    return torch.mul(x, inverse).round_(), inverse.reciprocal_()


def rounded(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``m * s`` of :func:`to_fixed` as one float64 tensor: each row rounded to ``bits`` bits
    below its largest magnitude's power of two. A product of two such rows sums exactly for the
    same reason integers do (every term is an integer times the same two powers of two), so a
    caller needs no separate scales as long as each sum stays within one row of each operand."""
    x, inverse = _scaled(x, bits)
    return torch.mul(x, inverse).round_().div_(inverse)


def rounded_and_fixed(
    x: torch.Tensor, bits: int, split: int
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`rounded` of the rows ``x[..., :split, :]`` and :func:`to_fixed` of the rows
    ``x[..., split:, :]``, in one pass over ``x``: every step is row by row, so each row's
    numbers are those of the two functions alone, in a few ops fewer (a decode step rounds its
    queries and keys and puts its values in fixed point, at every layer)."""
    x, inverse = _scaled(x, bits)
    ints = torch.mul(x, inverse).round_()
    head, tail = inverse[..., :split, :], inverse[..., split:, :]
    return ints[..., :split, :].div(head), (ints[..., split:, :], tail.reciprocal())


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple

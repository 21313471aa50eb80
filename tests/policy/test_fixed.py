"""policy.fixed: each row as integers times one power of two of its own, and the one-pass form a
decode step uses, which must give each row exactly the numbers of the two functions alone."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from policy.fixed import operand_bits, rounded, rounded_and_fixed, to_fixed


def _rows(seed: int, batch: int, rows: int, width: int, zero_row: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-30, 30, (batch, rows, 1), generator=g).double())
    x = torch.randn(batch, rows, width, generator=g, dtype=torch.float64) * scale
    if zero_row:
        x[:, 0] = 0.0
    return x


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (``torch.equal`` would call -0.0 and 0.0 the same)."""
    return a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.int64), b.contiguous().view(torch.int64)
    )


@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 5),
    rows=st.integers(2, 9),
    width=st.sampled_from([1, 7, 48, 64, 65]),
    zero_row=st.booleans(),
    data=st.data(),
)
def test_to_fixed_keeps_its_bound_and_the_one_pass_form_is_the_two_alone(
    seed: int, batch: int, rows: int, width: int, zero_row: bool, data: st.DataObject
) -> None:
    x = _rows(seed, batch, rows, width, zero_row)
    bits = operand_bits(data.draw(st.sampled_from([48, 896, 32_768])))
    m, s = to_fixed(x, bits)
    assert torch.equal(m, m.round()) and bool((m.abs() <= 2**bits).all())
    assert bool(((x - m * s).abs() <= s / 2).all())
    assert torch.equal(rounded(x, bits), m * s)
    split = data.draw(st.integers(1, rows - 1))
    head, (tail_m, tail_s) = rounded_and_fixed(x.clone(), bits, split)
    assert _same_bits(head, rounded(x[:, :split], bits))
    want_m, want_s = to_fixed(x[:, split:], bits)
    assert _same_bits(tail_m, want_m) and _same_bits(tail_s, want_s)

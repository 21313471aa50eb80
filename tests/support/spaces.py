"""Hypothesis strategies: arbitrary valid action spaces (``spaces``) and their parts."""

from __future__ import annotations

from hypothesis import strategies as st

from collective import ActionSpace, ArgSpec, ToolSpec

names = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
words = st.from_regex(r"[A-Za-z0-9_.:#/+-]{1,6}", fullmatch=True)


@st.composite
def int_args(draw: st.DrawFn) -> ArgSpec:
    lo = draw(st.integers(-1200, 1200) | st.sampled_from([0, 1, -1, 9, 10, 99, 100]))
    hi = lo + draw(st.integers(0, 1500) | st.sampled_from([0, 1, 9, 99_999]))
    return ArgSpec("n", "int", lo=lo, hi=hi)


choice_args = st.lists(words, min_size=1, max_size=6, unique=True).map(
    lambda c: ArgSpec("c", "choice", choices=tuple(c))
)
text_args = st.integers(1, 30).map(lambda m: ArgSpec("t", "text", max_chars=m, words=("ab", "c d")))


@st.composite
def tools(draw: st.DrawFn) -> ToolSpec:
    args = draw(st.lists(int_args() | choice_args, max_size=3))
    if draw(st.booleans()):
        args.append(draw(text_args))
    return ToolSpec(draw(names), tuple(args))


spaces = st.lists(tools(), min_size=1, max_size=5, unique_by=lambda t: t.name).map(
    lambda ts: ActionSpace(tuple(ts))
)

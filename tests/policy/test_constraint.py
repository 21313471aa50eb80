"""Action spaces as structured-output constraints: exactly the valid actions, in every engine.

Properties: every action the random policy samples fully matches the regex; every string the
regex generates parses as an action and is its canonical text; integer ranges match exactly
their numbers. With XGrammar installed (SGLang's default grammar backend, which runs on a CPU
too), the regex and the EBNF grammar are compiled by the real engine and must accept and reject
exactly what Python's ``re`` does.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collective import ActionSpace, ArgSpec, ToolSpec, parse_action
from collective.base.actions import format_action
from policy.base import PolicyRequest
from policy.constraint import action_ebnf, action_regex
from policy.uniform import sample_action
from worlds.tally import Tally

# Strings drawn from a constraint: any character, or mostly printable ASCII plus the characters
# the format forbids inside a text argument (so a constraint letting them through is caught).
ALPHABETS = st.sampled_from(
    [
        st.characters(codec="utf-8"),
        st.characters(min_codepoint=32, max_codepoint=126, include_characters='\n\r\t"\\é'),
    ]
)
WORD = st.from_regex(r"[A-Za-z0-9_.:#/+-]{1,6}", fullmatch=True)


@st.composite
def int_ranges(draw: st.DrawFn) -> tuple[int, int]:
    lo = draw(st.integers(-(10**7), 10**7))
    width = draw(st.sampled_from([0, 1, 9, 10, 99, 345, 10**4, 10**7]))
    return lo, lo + draw(st.integers(0, width))


@st.composite
def args(draw: st.DrawFn, last: bool) -> ArgSpec:
    kind = draw(st.sampled_from(["int", "choice", "text"] if last else ["int", "choice"]))
    if kind == "int":
        lo, hi = draw(int_ranges())
        return ArgSpec("n", "int", lo=lo, hi=hi)
    if kind == "choice":
        return ArgSpec(
            "c", "choice", choices=tuple(draw(st.lists(WORD, min_size=1, max_size=5, unique=True)))
        )
    words = tuple(draw(st.lists(st.from_regex(r"[a-z]{1,7}", fullmatch=True), max_size=4)))
    return ArgSpec("t", "text", max_chars=draw(st.integers(1, 40)), words=words)


@st.composite
def spaces(draw: st.DrawFn) -> ActionSpace:
    names = draw(
        st.lists(
            st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True),
            min_size=1,
            max_size=5,
            unique=True,
        )
    )
    tools = []
    for name in names:
        n = draw(st.integers(0, 3))
        tools.append(ToolSpec(name, tuple(draw(args(i == n - 1)) for i in range(n))))
    return ActionSpace(tuple(tools))


def one_int(lo: int, hi: int) -> ActionSpace:
    return ActionSpace((ToolSpec("t", (ArgSpec("n", "int", lo=lo, hi=hi),)),))


@given(int_ranges(), st.integers(-1000, 1000), st.integers(0, 2))
def test_an_int_range_matches_exactly_its_numbers(bounds, offset, anchor):
    lo, hi = bounds
    regex = action_regex(one_int(lo, hi))
    x = (lo, hi, (lo + hi) // 2)[anchor] + offset
    assert bool(re.fullmatch(regex, f"t {x}")) == (lo <= x <= hi)
    for y in (lo, hi, lo - 1, hi + 1):
        assert bool(re.fullmatch(regex, f"t {y}")) == (lo <= y <= hi)
    # only the canonical spelling: no leading zeros, no "-0", no "+"
    assert not re.fullmatch(regex, f"t 0{abs(x)}")
    assert not re.fullmatch(regex, "t -0") and not re.fullmatch(regex, f"t +{abs(x)}")


def test_small_ranges_exhaustively():
    for lo in range(-25, 26, 3):
        for hi in range(lo, 130, 7):
            regex = re.compile(action_regex(one_int(lo, hi)))
            for x in range(-140, 140):
                assert bool(regex.fullmatch(f"t {x}")) == (lo <= x <= hi), (lo, hi, x)


def test_the_range_regex_stays_small():
    regex = action_regex(one_int(-(10**9), 10**9))
    assert len(regex) < 600  # digit classes, not an alternation of two billion numbers


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(spaces(), st.integers(0, 2**64 - 1))
def test_every_random_policy_action_matches(space, seed):
    text, _, _ = sample_action(PolicyRequest(agent=0, turn=0, prompt="", space=space, seed=seed))
    assert re.fullmatch(action_regex(space), text), text


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_string_of_the_regex_is_a_valid_canonical_action(data):
    space = data.draw(spaces())
    text = data.draw(
        st.from_regex(action_regex(space), fullmatch=True, alphabet=data.draw(ALPHABETS))
    )
    action = parse_action(text, space)  # raises on anything invalid
    assert format_action(action.tool, *action.args, space=space) == text


def test_a_world_space_regex_and_ebnf_read_as_documented():
    space = ActionSpace(Tally(2).tool_specs())
    regex = re.compile(action_regex(space))
    assert regex.fullmatch('note ""') and regex.fullmatch('note "' + "é" * 20 + '"')
    for text in ['note "a"b"', 'note "a\nb"', 'note "' + "x" * 21 + '"', "note x", "add 1 "]:
        assert not regex.fullmatch(text), text
    assert action_regex(space) == (
        r'(add [1-3]|mark (red|green|blue)|note "[^"\n]{0,20}"|sleep [1-5])'
    )
    assert action_ebnf(space).splitlines() == [
        "root ::= tool_add | tool_mark | tool_note | tool_sleep",
        'tool_add ::= "add" " " [1-3]',
        'tool_mark ::= "mark" " " ("red" | "green" | "blue")',
        r'tool_note ::= "note" " " "\"" [^"\n]{0,20} "\""',
        'tool_sleep ::= "sleep" " " [1-5]',
    ]


# -- the real grammar engine -------------------------------------------------------------------


def near_misses(text: str) -> list[str]:
    """Strings one edit away from an action: most are not actions."""
    out = [text + "0", text[:-1], text + " ", " " + text, text + '"', text.replace(" ", "  ", 1)]
    digits = [i for i, c in enumerate(text) if c in "0123456789"]
    if digits:
        i = digits[-1]
        out.append(text[:i] + str((int(text[i]) + 5) % 10) + text[i + 1 :])
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_xgrammar_accepts_exactly_what_python_re_accepts(data):
    xgr = pytest.importorskip("xgrammar")
    accepts = xgr.testing._is_grammar_accept_string
    space = data.draw(spaces())
    regex = action_regex(space)
    by_regex, by_ebnf = xgr.Grammar.from_regex(regex), xgr.Grammar.from_ebnf(action_ebnf(space))
    seed = data.draw(st.integers(0, 2**64 - 1))
    sampled, _, _ = sample_action(PolicyRequest(agent=0, turn=0, prompt="", space=space, seed=seed))
    generated = data.draw(st.from_regex(regex, fullmatch=True, alphabet=data.draw(ALPHABETS)))
    for text in [sampled, generated, *near_misses(sampled), *near_misses(generated)]:
        want = bool(re.fullmatch(regex, text))
        assert accepts(by_regex, text) == want, (regex, text)
        assert accepts(by_ebnf, text) == want, (action_ebnf(space), text)

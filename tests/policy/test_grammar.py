"""The grammar automaton accepts exactly valid actions: property tests against parse_action."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collective  # noqa: F401  (import the engine before policy: policy.base imports it)
from collective import ActionSpace, ArgSpec, ToolSpec, parse_action
from collective.base.seeding import Stream
from policy import tokenizer
from policy.base import PolicyRequest
from policy.grammar import BLOCKED, DONE, START, Grammar, batch_tables, compile_space
from policy.uniform import _spare, sample_action
from tests.support.busy import scaled
from tests.support.spaces import int_args, spaces

EOS = tokenizer.EOS
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def walk(g: Grammar, rng: Stream, budget: int | None = None) -> list[int]:
    """A uniformly random path through the automaton (within ``budget`` tokens if given)."""
    state, out = START, []
    while state != DONE:
        left = BLOCKED - 1 if budget is None else budget - len(out)
        options = [t for t in range(tokenizer.VOCAB_SIZE) if g.cost[state, t] <= left]
        assert options, f"stuck in state {state} after {tokenizer.decode(out)!r}"
        t = options[rng.below(len(options))]
        out.append(t)
        state = int(g.next_state[state, t])
    return out


# -- properties ------------------------------------------------------------------------------


@FAST
@given(space=spaces, seed=st.integers(0, 2**64 - 1))
def test_every_random_walk_is_a_valid_action(space: ActionSpace, seed: int) -> None:
    g = compile_space(space)
    rng = Stream(seed)
    for _ in range(5):
        ids = walk(g, rng)
        assert ids[-1] == EOS and EOS not in ids[:-1]
        parse_action(tokenizer.decode(ids), space)  # raises if invalid
        assert g.accepts(ids)
        assert g.shortest <= len(ids) <= g.longest


@FAST
@given(space=spaces, seed=st.integers(0, 2**64 - 1))
def test_every_random_policy_action_is_accepted(space: ActionSpace, seed: int) -> None:
    g = compile_space(space)
    req = PolicyRequest(agent=0, turn=0, prompt="", space=space, seed=seed)
    text, ids, _ = sample_action(req)
    assert g.accepts(ids), text
    assert g.accepts([*tokenizer.encode(text), EOS])


@FAST
@given(space=spaces, seed=st.integers(0, 2**64 - 1), bound=st.integers(1, 64))
def test_a_random_policy_action_fits_its_bound(space: ActionSpace, seed: int, bound: int) -> None:
    """The random policy read no bound: under ``max_output_tokens = 24`` (the scale study's)
    it said ``post all "need have next"`` (27 tokens), which the engine rejects. Wherever a tool
    of the space fits the bound with its arguments at their least, the answer is within it."""
    req = PolicyRequest(agent=0, turn=0, prompt="", space=space, seed=seed, max_tokens=bound)
    text, ids, lps = sample_action(req)
    assert compile_space(space).accepts(ids), text
    assert len(lps) == len(ids)
    if any(_spare(t, bound) >= 0 for t in space.tools):
        assert len(ids) <= bound, (text, bound)


@FAST
@given(space=spaces, seed=st.integers(0, 2**64 - 1), extra=st.integers(0, 6))
def test_a_budgeted_walk_always_finishes_within_its_budget(
    space: ActionSpace, seed: int, extra: int
) -> None:
    g = compile_space(space)
    budget = g.shortest + extra
    ids = walk(g, Stream(seed), budget)
    assert len(ids) <= budget
    parse_action(tokenizer.decode(ids), space)


@FAST
@given(arg=int_args())
def test_int_automaton_accepts_exactly_its_range(arg: ArgSpec) -> None:
    g = compile_space(ActionSpace((ToolSpec("n", (arg,)),)))
    span = range(arg.lo - 40, min(arg.hi, arg.lo + 1500) + 40)
    got = {v for v in span if g.accepts([*tokenizer.encode(f"n {v}"), EOS])}
    assert got == {v for v in span if arg.lo <= v <= arg.hi}
    assert g.accepts([*tokenizer.encode(f"n {arg.hi}"), EOS])
    # Non-canonical spellings parse_action would take are never produced.
    assert not g.accepts([*tokenizer.encode(f"n 0{abs(arg.hi)}"), EOS])
    assert not g.accepts([*tokenizer.encode("n -0"), EOS])


@st.composite
def canonical_actions(draw: st.DrawFn) -> tuple[ActionSpace, str]:
    """A space and an action of it, written canonically, drawn independently of the automaton."""
    space = draw(spaces)
    tool = draw(st.sampled_from(space.tools))
    parts = [tool.name]
    for a in tool.args:
        if a.kind == "int":
            parts.append(str(draw(st.integers(a.lo, a.hi))))
        elif a.kind == "choice":
            parts.append(draw(st.sampled_from(a.choices)))
        else:
            alphabet = st.characters(min_codepoint=32, max_codepoint=126, exclude_characters='"')
            parts.append('"' + draw(st.text(alphabet, max_size=a.max_chars)) + '"')
    return space, " ".join(parts)


@FAST
@given(case=canonical_actions())
def test_every_canonical_action_is_accepted(case: tuple[ActionSpace, str]) -> None:
    space, text = case
    parse_action(text, space)
    assert compile_space(space).accepts([*tokenizer.encode(text), EOS]), text


@FAST
@given(case=canonical_actions(), cut=st.integers(0, 200))
def test_a_proper_prefix_is_never_a_whole_action(case: tuple[ActionSpace, str], cut: int) -> None:
    space, text = case
    ids = tokenizer.encode(text)
    g = compile_space(space)
    prefix = ids[: cut % (len(ids) + 1)]
    if g.accepts([*prefix, EOS]):  # a shorter valid action (e.g. "n 1" of "n 12") must parse
        parse_action(tokenizer.decode(prefix), space)


# -- concrete cases --------------------------------------------------------------------------


def test_shared_text_and_large_ranges_stay_small_and_fast() -> None:
    text = ArgSpec("text", "text", max_chars=80)
    space = ActionSpace(
        (
            ToolSpec("msg", (ArgSpec("to", "int", lo=0, hi=99_999), text)),
            ToolSpec("post", (ArgSpec("ch", "choice", choices=("all", "allies", "a")), text)),
            ToolSpec("put", (text,)),
            ToolSpec("wait", (ArgSpec("s", "int", lo=-5, hi=600),)),
        )
    )
    t0 = time.perf_counter()
    g = Grammar(space)
    assert time.perf_counter() - t0 < scaled(1.0)  # generous: it takes milliseconds
    # One text chain of 83 states shared by three tools, a few dozen for the ranges.
    assert g.n_states < 200, g.n_states
    for ok in [
        'msg 99999 "hi"',
        'post allies ""',
        'post a "x"',
        "wait -5",
        "wait 600",
        'put "a b"',
    ]:
        assert g.accepts([*tokenizer.encode(ok), EOS]), ok
    for bad in ['msg 100000 "hi"', 'post al "x"', "wait 601", "wait", 'put "' + "x" * 81 + '"']:
        assert not g.accepts([*tokenizer.encode(bad), EOS]), bad


def test_tool_without_arguments_and_prefix_names() -> None:
    space = ActionSpace((ToolSpec("go"), ToolSpec("go_on", (ArgSpec("n", "int", lo=1, hi=2),))))
    g = compile_space(space)
    assert g.accepts([*tokenizer.encode("go"), EOS])
    assert g.accepts([*tokenizer.encode("go_on 2"), EOS])
    assert not g.accepts([*tokenizer.encode("go 1"), EOS])
    assert g.shortest == 3


def test_budget_cost_table_counts_eos() -> None:
    g = compile_space(ActionSpace((ToolSpec("wait", (ArgSpec("s", "int", lo=0, hi=600),)),)))
    assert g.shortest == len("wait 0") + 1
    w = ord("w")
    assert g.cost[START, w] == g.shortest
    assert g.cost[START, ord("x")] == BLOCKED


def test_batch_tables_offset_each_space() -> None:
    a = ActionSpace((ToolSpec("add", (ArgSpec("n", "int", lo=1, hi=3),)),))
    b = ActionSpace((ToolSpec("mark", (ArgSpec("c", "choice", choices=("red", "blue")),)),))
    tables = batch_tables([a, b, a, b, b])
    assert len(tables.grammars) == 2 and tables.which == [0, 1, 0, 1, 1]
    for i, text in [(0, "add 2"), (1, "mark red"), (4, "mark blue")]:
        state = int(tables.start[i])
        for t in [*tokenizer.encode(text), EOS]:
            assert tables.cost[state, t] < BLOCKED, (text, t)
            state = int(tables.next_state[state, t])
        assert bool(tables.final[state])
    state = int(tables.start[0])
    assert tables.cost[state, ord("m")] >= BLOCKED  # request 0 cannot take request 1's tools


def test_compiled_once_per_space() -> None:
    space = ActionSpace((ToolSpec("x"),))
    same = ActionSpace((ToolSpec("x"),))
    assert compile_space(space) is compile_space(same)


@pytest.mark.parametrize("lo,hi", [(0, 0), (5, 5), (-5, -5), (-10, -3), (7, 123), (99, 1000)])
def test_int_edges(lo: int, hi: int) -> None:
    g = compile_space(ActionSpace((ToolSpec("n", (ArgSpec("v", "int", lo=lo, hi=hi),)),)))
    got = [v for v in range(-1100, 1100) if g.accepts([*tokenizer.encode(f"n {v}"), EOS])]
    assert got == list(range(lo, hi + 1))

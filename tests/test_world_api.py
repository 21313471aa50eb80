"""Declaring worlds and actions: machine-readable domains, and clear errors when they are wrong."""

from __future__ import annotations

from typing import Annotated

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collective import ActionError, ActionSpace, ArgSpec, ToolSpec, World, parse_action
from collective.actions import format_action
from collective.world import OneOf, Range, Text, tool
from worlds.tally import Tally


def test_tool_domains_are_resolved_against_the_instance() -> None:
    specs = {s.name: s for s in Tally(n_agents=3).tool_specs()}
    assert specs["add"].args == (ArgSpec("amount", "int", lo=1, hi=3),)
    assert specs["mark"].args[0].choices == ("red", "green", "blue")
    note = specs["note"].args[0]
    assert note.kind == "text" and note.max_chars == 20 and "count" in note.words
    assert specs["add"].doc == "add to the shared counter"


def test_a_domain_may_scale_with_the_world() -> None:
    class Rooms(World):
        def __init__(self, n_agents: int = 1, seed: int = 0) -> None:
            super().__init__(n_agents, seed)
            self.rooms = [f"r{i}" for i in range(2 * n_agents)]

        @tool(duration=lambda w, agent, room: 1.0 + len(room))
        def enter(self, agent: int, room: Annotated[str, OneOf("rooms")]) -> str:
            return room

        @tool()
        def knock(
            self, agent: int, door: Annotated[int, Range(0, lambda w: 3 * w.n_agents)]
        ) -> str:
            return "knock"

        def observe(self, agent: int) -> str:
            return ""

        def score(self) -> float:
            return 0.0

    w = Rooms(n_agents=5)
    specs = {s.name: s for s in w.tool_specs()}
    assert len(specs["enter"].args[0].choices) == 10
    assert specs["knock"].args[0].hi == 15
    assert w.tool_duration("enter", 0, ("r7",)) == 3.0


def test_a_tool_argument_without_a_domain_is_refused_at_class_creation() -> None:
    with pytest.raises(TypeError, match=r"Broken.move: argument 'steps' needs a domain"):

        class Broken(World):
            @tool()
            def move(self, agent: int, steps: int) -> str:
                return ""

    with pytest.raises(TypeError, match="a Text argument must be the last one"):

        class Backwards(World):
            @tool()
            def say(
                self, agent: int, text: Annotated[str, Text(9)], n: Annotated[int, Range(0, 1)]
            ) -> str:
                return ""


def test_an_empty_domain_is_refused() -> None:
    with pytest.raises(ValueError, match=r"empty range 5\.\.1"):
        ActionSpace((ToolSpec("go", (ArgSpec("n", "int", lo=5, hi=1),)),))
    with pytest.raises(ValueError, match="choice 'two words'"):
        ActionSpace((ToolSpec("go", (ArgSpec("c", "choice", choices=("two words",)),)),))
    with pytest.raises(ValueError, match="duplicate tool names"):
        ActionSpace((ToolSpec("go"), ToolSpec("go")))


SPACE = ActionSpace(
    (
        ToolSpec(
            "go", (ArgSpec("n", "int", lo=-5, hi=120), ArgSpec("c", "choice", choices=("a", "b")))
        ),
        ToolSpec("say", (ArgSpec("to", "int", lo=0, hi=9), ArgSpec("text", "text", max_chars=12))),
        ToolSpec("rest"),
    )
)


@given(
    st.one_of(
        st.tuples(st.just("go"), st.integers(-5, 120), st.sampled_from(["a", "b"])),
        st.tuples(st.just("say"), st.integers(0, 9), st.text(alphabet="abc xyz.!", max_size=12)),
        st.tuples(st.just("rest")),
    )
)
def test_format_then_parse_is_the_identity(action: tuple) -> None:
    text = format_action(action[0], *action[1:], space=SPACE)
    parsed = parse_action(text, SPACE)
    assert (parsed.tool, *parsed.args) == action


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("go 121 a", "n must be in -5..120"),
        ("go " + "9" * 5000 + " a", "n must be in -5..120"),  # int() would raise ValueError
        ("go 1 c", "c must be one of ['a', 'b']"),
        ("go 1", "go takes 2 argument(s): go <n:-5..120> <c:a|b>"),
        ('say 1 "this is far too long"', "at most 12"),
        ('say 1 "a" "b"', "one double-quoted string"),
        ("rest now", "rest takes 0 argument(s)"),
        ("go  1 a", "go takes 2 argument(s)"),
        ("Go 1 a", "unknown tool 'Go'"),
        ("go 1 a\nrest", "an action is one line"),
    ],
)
def test_invalid_actions_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ActionError) as e:
        parse_action(text, SPACE)
    assert message in str(e.value)

"""Declaring worlds and actions: machine-readable domains, and clear errors when they are wrong."""

from __future__ import annotations

import re
from typing import Annotated

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collective import (
    ActionError,
    ActionSpace,
    ArgSpec,
    OneOf,
    Range,
    Text,
    ToolSpec,
    World,
    parse_action,
    tool,
)
from collective.base.actions import format_action
from collective.world import check_built, convert_params
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


# -- everything checkable, checked when the class is defined or built ------------------------


def _define(body: str) -> type[World]:
    """Define a World subclass from the text of its body (tools and methods)."""
    namespace: dict[str, object] = {
        "World": World,
        "tool": tool,
        "Range": Range,
        "Annotated": Annotated,
    }
    exec("class W(World):\n" + body, namespace)
    return namespace["W"]  # type: ignore[return-value]


SCORED = (
    "    def observe(self, agent):\n        return ''\n    def score(self):\n        return 0.0\n"
)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    @tool()\n    def msg(self, agent): return ''\n", "named like the engine's primitive"),
        ("    @tool()\n    def wait(self, agent): return ''\n", "primitive 'wait'"),
        ("    @tool()\n    def done(self, agent): return ''\n", "named like World.done"),
        ("    @tool()\n    def after(self, agent): return ''\n", "named like World.after"),
        ("    @tool()\n    def seed(self, agent): return ''\n", "named like World.seed"),
        ("    @tool(duration=-5.0)\n    def go(self, agent): return ''\n", "finite number >= 0"),
        ("    @tool(duration=float('nan'))\n    def go(self, agent): return ''\n", ">= 0, got nan"),
        ("    @tool(duration=[1])\n    def go(self, agent): return ''\n", "got [1]"),
        ("    @tool(duration='no such')\n    def go(self, agent): return ''\n", "not an attribute"),
        (
            "    @tool(duration=lambda w: 1.0)\n    def go(self, agent): return ''\n",
            "cannot be called as f(world, agent)",
        ),
        (
            "    @tool(duration=lambda w, agent: 1.0)\n"
            "    def go(self, agent, n: Annotated[int, Range(0, 1)]): return ''\n",
            "f(world, agent, n=...)",
        ),
    ],
)
def test_a_bad_tool_is_refused_when_its_class_is_defined(body: str, message: str) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        _define(body + SCORED)


def test_an_attribute_that_hides_a_tool_is_refused() -> None:
    base = _define("    @tool()\n    def claim(self, agent): return ''\n" + SCORED)
    with pytest.raises(TypeError, match=r"W2.claim: a class attribute \(list\) hides the tool"):
        type("W2", (base,), {"claim": []})
    hider = _define(
        "    def __init__(self, n_agents=1, seed=0):\n"
        "        super().__init__(n_agents, seed)\n"
        "        self.claim = []\n"
        "    @tool()\n    def claim(self, agent): return ''\n" + SCORED
    )
    with pytest.raises(ValueError, match=r"self\.claim \(list\) hides the tool 'claim'"):
        check_built(hider())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "    def __init__(self, n_agents=1, seed=0):\n        self.n = 1\n" + SCORED,
            "W.__init__ does not call super().__init__(n_agents, seed)",
        ),
        ("    def score(self):\n        return 0.0\n", "W defines no observe(agent) -> str"),
        ("    def observe(self, agent):\n        return ''\n", "W defines no score() -> float"),
        (
            "    @tool(duration='nosuch')\n    def go(self, agent): return ''\n" + SCORED,
            "W.go: duration names attribute 'nosuch', which the world does not have",
        ),
        (
            "    slow = 'very'\n    @tool(duration='slow')\n    def go(self, agent): return ''\n"
            + SCORED,
            "W.go: duration names 'slow', which is 'very', not a number of seconds",
        ),
        (
            "    @tool()\n    def go(self, agent, n: Annotated[int, Range(0, 'top')]): return ''\n"
            + SCORED,
            "W.go: the domain of 'n' names attribute 'top', which the world does not have",
        ),
        (
            "    top = -1\n"
            "    @tool()\n    def go(self, agent, n: Annotated[int, Range(0, 'top')]): return ''\n"
            + SCORED,
            "empty range 0..-1",
        ),
    ],
)
def test_what_only_a_built_world_shows_is_refused_before_its_episode(
    body: str, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_built(_define(body)())


def test_parameters_are_converted_to_the_constructors_annotations() -> None:
    from worlds.relay import Relay

    got = convert_params(Relay, {"size": "3", "submit_seconds": 2, "view": 2.0}, "relay")
    assert got == {"size": 3, "submit_seconds": 2.0, "view": 2}
    assert type(got["submit_seconds"]) is float and type(got["size"]) is int
    with pytest.raises(ValueError, match=r"parameter size='abc': Expected `int`, got `str`"):
        convert_params(Relay, {"size": "abc"}, "relay")
    with pytest.raises(ValueError, match=r"parameter view=2.5: Expected `int`, got `float`"):
        convert_params(Relay, {"view": 2.5}, "relay")
    with pytest.raises(ValueError, match=r"has no parameter 'sise'; it takes: size, view"):
        convert_params(Relay, {"sise": 3}, "relay")
    with pytest.raises(ValueError, match=r"seed is set by the engine"):
        convert_params(Relay, {"seed": 3}, "relay")
    # An unannotated parameter takes the value as given.
    loose = _define(
        "    def __init__(self, n_agents=1, seed=0, mode=None):\n"
        "        super().__init__(n_agents, seed)\n" + SCORED
    )
    assert convert_params(loose, {"mode": [1, "x"]}, "w") == {"mode": [1, "x"]}

"""ORS tool schemas as typed arguments, and results as recorded text: pure functions, so these
run without the ``ors`` extra."""

from __future__ import annotations

import math

import pytest

from collective.world.ors import (
    OrsError,
    Outcome,
    check_reward,
    map_tool,
    parse_result,
    result_text,
)


def _args(schema: dict) -> list[list]:
    return map_tool("act", "do it", schema)["args"]


def test_bounded_integers_enums_booleans_and_one_text_map_with_the_text_last() -> None:
    schema = {
        "properties": {
            "note": {"type": "string", "maxLength": 30},
            "tile": {"type": "integer", "minimum": 0, "maximum": 5},
            "colour": {"$ref": "#/$defs/Colour"},
            "level": {
                "anyOf": [
                    {"type": "integer", "exclusiveMinimum": 0, "maximum": 3},
                    {"type": "null"},
                ]
            },
            "loud": {"type": "boolean"},
            "size": {"enum": [1, 2, 4]},
        },
        "$defs": {"Colour": {"enum": ["red", "blue"], "type": "string"}},
    }
    assert _args(schema) == [
        ["tile", "int", 0, 5, [], 0, "integer"],
        ["colour", "choice", 0, 0, ["red", "blue"], 0, "string"],
        ["level", "int", 1, 3, [], 0, "integer"],
        ["loud", "choice", 0, 0, ["true", "false"], 0, "boolean"],
        ["size", "choice", 0, 0, ["1", "2", "4"], 0, "integer"],
        ["note", "text", 0, 0, [], 30, "string"],  # moved last: an action's text comes last
    ]
    assert map_tool("look", "", None)["args"] == []


@pytest.mark.parametrize(
    ("prop", "says"),
    [
        ({"type": "number"}, "a number field cannot be an action's argument"),
        ({"type": "integer", "minimum": 0}, "an integer needs both bounds"),
        ({"type": "array", "items": {"type": "string"}}, "a array field"),
        ({"enum": ["two words"]}, "is not one word"),
    ],
)
def test_what_an_action_cannot_carry_is_refused_naming_the_tool_and_field(
    prop: dict, says: str
) -> None:
    with pytest.raises(ValueError, match="tool 'act', field 'bad'") as e:
        _args({"properties": {"bad": prop}})
    assert says in str(e.value)


def test_two_free_texts_and_bad_tool_names_are_refused() -> None:
    with pytest.raises(ValueError, match="field 'b': a second free-text field"):
        _args({"properties": {"a": {"type": "string"}, "b": {"type": "string"}}})
    with pytest.raises(ValueError, match="tool 'Look'"):
        map_tool("Look", "", None)
    with pytest.raises(ValueError, match="primitive 'msg'"):
        map_tool("msg", "", None)


def test_a_result_carries_its_reward_and_finish_where_the_text_cannot_forge_them() -> None:
    for out in [
        Outcome(True, "ok", 0.25, False),
        Outcome(True, "[reward 1.0] x", None, False),
        Outcome(True, "", 1.0, True),
        Outcome(True, "a\nb", None, True),
        Outcome(True, "t", 0.1 + 0.2, False),
    ]:
        assert parse_result(result_text(out)) == out
    assert result_text(Outcome(True, "[reward 1.0] x")) == "[no reward] [reward 1.0] x"


def test_rewards_outside_0_1_or_not_numbers_are_the_environments_bug() -> None:
    assert check_reward(None) is None and check_reward(1) == 1.0
    for bad in (1.5, -0.1, math.nan, math.inf, True, "1"):
        with pytest.raises(OrsError):
            check_reward(bad)

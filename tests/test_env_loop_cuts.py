"""Behaviour guards for the env loop's fast paths: each takes only the usual case, and the
unusual one still gets the general path's result (a task that is a Mapping but not a dict,
options given as one, a surrogate deep in arguments past plain numbers, a turn without stop
conditions)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from agentgym import ConfigError, ToolArgumentsError, ToolCall, ToolEnv, get_parser, tool
from agentgym._fast_schema import compile_fast_check
from tests.test_tool_env import add

CALL = get_parser("hermes").render("", [ToolCall("add", {"a": 2, "b": 3})])


@tool
def echo(data: dict[str, Any], count: int = 0, flag: bool = False) -> str:
    """Echo.

    Args:
        data: anything.
        count: a number.
        flag: a flag.
    """
    return "ok"


def test_a_task_that_is_a_mapping_but_not_a_dict_plays_as_a_dict_copy() -> None:
    """The dict fast path skips the Mapping check; a read-only mapping still plays, copied."""
    task = MappingProxyType({"prompt": "What is 2 + 3?", "answer": "5"})
    env = ToolEnv([add], tasks=[{"prompt": "first"}, task, 7], system_prompt="")  # type: ignore[list-item]
    messages, info = env.reset(options=MappingProxyType({"task": 1}))  # options as a Mapping too
    assert type(env.state.task) is dict and env.state.task == dict(task)
    assert info == {"task_index": 1, "task": dict(task)}
    assert messages == [{"role": "user", "content": "What is 2 + 3?"}]
    with pytest.raises(ConfigError, match=r"^task 2 is a int 7, not a dict; each task is a dict"):
        env.reset(options={"task": 2})


def test_a_surrogate_after_plain_numbers_is_still_found_where_it_is() -> None:
    """Numbers, booleans and None skip the text test; the string deep after them does not."""
    arguments = {"count": 1, "flag": True, "data": {"n": None, "x": 2.5, "k": ["ok", "\ud800"]}}
    with pytest.raises(ToolArgumentsError, match="lone surrogate") as excinfo:
        echo.validate(arguments)
    assert "arguments/data/k/1" in str(excinfo.value)
    assert echo.validate({"count": 1, "flag": True, "data": {"n": None}})["count"] == 1


@pytest.mark.parametrize(
    ("schema", "accepted", "left_to_jsonschema"),
    [
        ({"type": "integer"}, [0, -3], [True, 2.0, "1", None]),
        ({"type": ["string", "null"]}, ["", None], [1, ["a"]]),
        ({"description": "anything"}, [None, 1, "a", [1], {"k": 1}], [(1, 2), {"a"}]),
    ],
)
def test_a_type_only_schema_accepts_exactly_its_json_types(
    schema: dict[str, Any], accepted: list[Any], left_to_jsonschema: list[Any]
) -> None:
    """The type-only check answers as the general one: True only for the schema's JSON types."""
    check = compile_fast_check(schema)
    assert check is not None
    assert all(check(value) for value in accepted)
    assert not any(check(value) for value in left_to_jsonschema)


def test_a_tool_turn_without_stop_conditions_is_not_terminated_and_says_so_as_a_bool() -> None:
    """The stop conditions are skipped when there are none; ``terminated`` stays a bool."""
    env = ToolEnv([add], tasks=[{"prompt": "2 + 3?", "answer": "5"}], system_prompt="")
    env.reset(options={"task": 0})
    new, _, terminated, truncated, info = env.step(CALL)
    assert terminated is False and truncated is False
    assert list(new[0]) == ["role", "content", "tool_calls"] and new[1]["content"] == "5"
    final, _, terminated, _, info = env.step("It is 5.")
    assert terminated is True and final == [{"role": "assistant", "content": "It is 5."}]
    assert "teardown_error" not in info

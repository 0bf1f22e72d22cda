"""The fast schema check: never "valid" where jsonschema says invalid; fast for tool schemas."""

from __future__ import annotations

import enum
import itertools
import random
from typing import Any, Literal, Optional

import jsonschema
import pytest

from agentgym import ToolArgumentsError, tool
from agentgym._fast_schema import compile_fast_check
from agentgym._tool_schema import parameter_schemas


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


HINTS: list[Any] = [
    str, int, float, bool, list[int], dict[str, float], Literal["a", "b"], Optional[int],  # noqa: UP045
    int | str, list[Mode], Mode, Level, Optional[Mode], dict[str, list[str]], Any,  # noqa: UP045
]  # fmt: skip

VALUES: list[Any] = [
    None, True, False, 0, 1, -3, 2.0, 2.5, float("nan"), "", "a", "b", "fast", "slow", "x",
    [], [1, 2], [1, "x"], ["fast"], ["fast", "nope"], [1.0], [True], {}, {"k": 1.5},
    {"k": "x"}, {"k": ["a"]}, {"k": [1]}, {1: 2}, (1, 2), {"a", "b"},
]  # fmt: skip


def type_schema(hint: Any) -> dict[str, Any]:
    """The schema a tool shows for a parameter of type ``hint`` (what `Tool` builds on)."""
    properties, defs, _ = parameter_schemas("test", {"value": hint})
    return {**properties["value"], **({"$defs": defs} if defs else {})}


def object_schema(hints: dict[str, Any], required: list[str], extra: Any = False) -> Any:
    properties, defs, _ = parameter_schemas("test", hints)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": extra,
        **({"$defs": defs} if defs else {}),
    }


SCHEMAS = [type_schema(h) for h in HINTS] + [
    object_schema({"a": int, "b": int}, ["a", "b"]),
    object_schema({"a": int, "mode": Mode}, ["a"], extra=True),
    object_schema({"a": Optional[str]}, [], extra={"type": "integer"}),  # noqa: UP045
    {"enum": [1, True, "x"]},  # numbers and booleans in an enum: jsonschema decides
    {"type": "integer", "minimum": 3},  # a keyword it does not decide: no fast path
    {"type": "array", "items": {"type": "string", "maxLength": 2}},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: str(s)[:60])
def test_fast_check_never_accepts_what_jsonschema_rejects(schema: Any) -> None:
    check = compile_fast_check(schema)
    validator = jsonschema.Draft202012Validator(schema)
    values = VALUES + [{"a": a, "b": b} for a, b in itertools.product(VALUES[:12], repeat=2)]
    values += [{"a": 1, "mode": "fast", "x": v} for v in VALUES]
    if check is None:
        return
    for value in values:
        if check(value):
            assert validator.is_valid(value), (schema, value)


def test_fast_check_accepts_the_usual_valid_arguments() -> None:
    schema = object_schema(
        {"a": int, "ratio": float, "mode": Mode, "tags": list[str], "note": Optional[str]},  # noqa: UP045
        ["a"],
    )
    check = compile_fast_check(schema)
    assert check is not None
    assert check({"a": 6, "ratio": 1.5, "mode": "fast", "tags": ["x"], "note": None})
    assert check({"a": 6, "ratio": 2})  # an int is a number
    assert not check({"a": 6, "extra": 1})  # left to jsonschema, which rejects it
    assert not check({"ratio": 1.5})  # required "a" missing
    assert not check({"a": True})  # a bool is not an integer
    assert not check({"a": 2.0})  # an integer to jsonschema, but it decides that one


def test_schemas_with_undecided_keywords_get_no_fast_path() -> None:
    assert compile_fast_check({"type": "integer", "minimum": 3}) is None
    assert compile_fast_check({"type": "string", "format": "date"}) is None
    assert compile_fast_check({"enum": [1, True]}) is None
    assert compile_fast_check({"properties": {"a": {"pattern": "x"}}}) is None


def test_random_arguments_validate_as_jsonschema_says() -> None:
    @tool
    def pick(count: int, mode: Mode, tags: list[str], note: Optional[str] = None) -> str:  # noqa: UP045
        """Pick."""
        return ""

    validator = jsonschema.Draft202012Validator(pick.parameters)
    rng = random.Random(0)
    keys = ["count", "mode", "tags", "note", "other"]
    for _ in range(3000):
        args = {k: rng.choice(VALUES) for k in rng.sample(keys, rng.randint(0, 5))}
        try:
            pick.validate(args)
        except ToolArgumentsError:
            assert not validator.is_valid(args), args
        else:
            assert validator.is_valid(args), args


def test_a_schemas_refs_are_followed_once_per_schema_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Envs rebuild their tools for every instance: the $ref check is cached with the rest of
    the schema's checks, and a schema without a $ref is not walked at all."""
    import uuid

    from agentgym import _tool_schema
    from agentgym._tools import Tool

    walks: list[Any] = []
    walk = _tool_schema._unresolved_ref
    monkeypatch.setattr(_tool_schema, "_unresolved_ref", lambda s: walks.append(s) or walk(s))
    name = f"n{uuid.uuid4().hex}"  # a schema text no earlier test cached
    with_ref = {
        "type": "object",
        "$defs": {"N": {"type": "integer"}},
        "properties": {name: {"$ref": "#/$defs/N"}},
    }
    without = {"type": "object", "properties": {name: {"type": "integer"}}}
    for _ in range(3):
        tool = Tool(fn=lambda **_: "", name="t", description="", parameters=with_ref)
        Tool(fn=lambda **_: "", name="t", description="", parameters=without)
    assert len(walks) == 1
    assert tool.validate({name: 1}) == {name: 1}

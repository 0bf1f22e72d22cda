"""`agentgym.tool`: schemas from hints and docstrings, validation, injection, timeouts, errors."""

from __future__ import annotations

import asyncio
import enum
import json
import threading
import time
from typing import Literal, Optional

import pytest

from agentgym import (
    ConfigError,
    SandboxError,
    Tool,
    ToolArgumentsError,
    ToolError,
    ToolTimeoutError,
    tool,
)
from agentgym._tools import example_arguments


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@tool
def everything(
    text: str,
    count: int,
    ratio: float,
    flag: bool,
    numbers: list[int],
    weights: dict[str, float],
    mode: Literal["fast", "slow"],
    color: Color,
    maybe: Optional[int] = None,  # noqa: UP045  (the typing spelling is what we test)
    limit: int = 10,
) -> str:
    """Exercise every supported hint.

    Longer explanation of the tool.

    Args:
        text: some text.
        count: how many.
        ratio: a fraction.
        flag: on or off.
        numbers: a list of ints.
        weights: name to weight.
        mode: speed.
        color: a colour.
        maybe: optional number.
        limit: an upper bound.
    """
    return "ok"


def test_schema_types_from_hints() -> None:
    props = everything.parameters["properties"]
    assert props["text"]["type"] == "string"
    assert props["count"]["type"] == "integer"
    assert props["ratio"]["type"] == "number"
    assert props["flag"]["type"] == "boolean"
    assert props["numbers"]["type"] == "array"
    assert props["numbers"]["items"] == {"type": "integer"}
    assert props["weights"]["type"] == "object"
    assert props["weights"]["additionalProperties"] == {"type": "number"}
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert props["color"]["enum"] == ["red", "blue"]
    assert everything.parameters["additionalProperties"] is False


def test_defaults_are_not_required() -> None:
    required = everything.parameters["required"]
    assert required == ["text", "count", "ratio", "flag", "numbers", "weights", "mode", "color"]
    assert everything.parameters["properties"]["limit"]["default"] == 10


def test_google_docstring_lands_in_schema() -> None:
    schema = everything.schema
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "everything"
    assert fn["description"].startswith("Exercise every supported hint.")
    assert "Longer explanation" in fn["description"]
    assert "Args:" not in fn["description"]
    assert fn["parameters"]["properties"]["numbers"]["description"] == "a list of ints."
    json.dumps(schema)  # the schema travels to the server as JSON


def test_numpy_docstring_lands_in_schema() -> None:
    @tool
    def search(query: str, k: int = 3) -> list[str]:
        """Search the index.

        Parameters
        ----------
        query : str
            What to look for.
        k : int
            How many hits to return.
        """
        return []

    props = search.parameters["properties"]
    assert search.description == "Search the index."
    assert props["query"]["description"] == "What to look for."
    assert props["k"]["description"] == "How many hits to return."
    assert search.parameters["required"] == ["query"]


def test_name_description_and_timeout_options() -> None:
    @tool(name="renamed", description="Custom.", timeout=1.5)
    def original(x: int) -> int:
        """Ignored summary."""
        return x

    assert isinstance(original, Tool)
    assert original.schema["function"]["name"] == "renamed"
    assert original.description == "Custom."
    assert original.timeout == 1.5
    assert original(4) == 4  # still callable as a plain function


def test_enum_default_keeps_schema_json_serializable() -> None:
    @tool
    def paint(color: Color = Color.RED) -> str:
        """Paint."""
        return color.value

    schema = json.loads(json.dumps(paint.schema))
    assert schema["function"]["parameters"]["properties"]["color"]["default"] == "red"


async def test_enum_argument_arrives_as_member() -> None:
    @tool
    def paint(color: Color) -> str:
        """Paint."""
        return repr(color)

    assert await paint.acall({"color": "blue"}) == repr(Color.BLUE)


@tool
def pick(n: Optional[int] = None) -> str:  # noqa: UP045
    """Pick."""
    return repr(n)


async def test_optional_validates_inner_type() -> None:
    assert "n" not in pick.parameters["required"]
    assert await pick.acall({}) == "None"
    assert await pick.acall({"n": 3}) == "3"
    with pytest.raises(ToolArgumentsError, match="n"):
        await pick.acall({"n": "three"})


async def test_optional_accepts_explicit_null() -> None:
    assert await pick.acall({"n": None}) == "None"


def test_injected_params_absent_from_schema() -> None:
    @tool
    def peek(path: str, task: dict, state: object, sandbox: object, messages: list, env: object):
        """Peek."""

    assert list(peek.parameters["properties"]) == ["path"]
    assert peek.parameters["required"] == ["path"]
    assert peek.injected == {"task", "state", "sandbox", "messages", "env"}


async def test_injected_params_filled_at_call_time() -> None:
    seen = {}

    @tool
    def peek(path: str, task, state, sandbox, messages, env) -> str:
        """Peek."""
        seen.update(task=task, state=state, sandbox=sandbox, messages=messages, env=env)
        return path

    context = {"task": {"id": 1}, "state": "S", "sandbox": "SB", "messages": [], "env": "E"}
    assert await peek.acall({"path": "p"}, context) == "p"
    assert seen == context


async def test_model_cannot_forge_injected_params() -> None:
    @tool
    def peek(task) -> str:
        """Peek."""
        return "never"

    with pytest.raises(ToolArgumentsError, match="task"):
        await peek.acall({"task": {"forged": True}}, {"task": {"real": True}})


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"count": "three"}, "count"),
        ({}, "count"),
        ({"count": 1, "extra": 2}, "extra"),
        ({"count": True}, "count"),
        ({"count": 1, "tags": [1]}, "tags"),
    ],
)
async def test_validation_error_names_field(arguments: dict, field: str) -> None:
    calls = []

    @tool
    def repeat(count: int, tags: list[str] | None = None) -> str:
        """Repeat."""
        calls.append(count)
        return "x" * count

    with pytest.raises(ToolArgumentsError, match=field) as excinfo:
        await repeat.acall(arguments)
    assert "repeat" in str(excinfo.value)
    assert calls == []  # validation happens before the call


async def test_non_object_arguments_rejected() -> None:
    with pytest.raises(ToolArgumentsError, match="JSON object"):
        await everything.acall(["not", "a", "dict"])  # type: ignore[arg-type]


class Opaque:
    pass


@pytest.mark.parametrize(
    "make",
    [
        lambda: tool(lambda x: x),  # no hint
        lambda: tool(_opaque_param),
        lambda: tool(_varargs),
        lambda: tool(_kwargs),
    ],
    ids=["missing-hint", "custom-class", "varargs", "kwargs"],
)
def test_unhintable_params_raise_config_error(make) -> None:
    with pytest.raises(ConfigError):
        make()


def _opaque_param(thing: Opaque) -> str:
    """Opaque."""
    return ""


def _varargs(*items: int) -> str:
    """Varargs."""
    return ""


def _kwargs(**options: int) -> str:
    """Kwargs."""
    return ""


async def test_sync_tool_runs_in_worker_thread() -> None:
    @tool
    def where() -> int:
        """Where."""
        return threading.get_ident()

    assert not where.is_async
    assert await where.acall({}) != threading.get_ident()


async def test_async_tool_is_awaited() -> None:
    @tool
    async def double(x: int) -> int:
        """Double."""
        await asyncio.sleep(0)
        return 2 * x

    assert double.is_async
    assert await double.acall({"x": 21}) == 42


async def test_async_tool_timeout_is_prompt() -> None:
    never = asyncio.Event()

    @tool(timeout=0.2)
    async def hang() -> str:
        """Hang."""
        await asyncio.wait_for(never.wait(), 5)
        return "late"

    start = time.perf_counter()
    with pytest.raises(ToolTimeoutError, match="hang"):
        await hang.acall({})
    assert time.perf_counter() - start < 1.0


async def test_sync_tool_timeout_is_prompt() -> None:
    release = threading.Event()

    @tool(timeout=0.2)
    def hang() -> str:
        """Hang."""
        release.wait(5)
        return "late"

    start = time.perf_counter()
    try:
        with pytest.raises(ToolTimeoutError, match="0.2"):
            await hang.acall({})
        assert time.perf_counter() - start < 1.0
    finally:
        release.set()  # let the worker thread finish so loop shutdown does not wait 5 s


async def test_raising_tool_gives_tool_error_naming_type() -> None:
    @tool
    def boom() -> str:
        """Boom."""
        raise ZeroDivisionError("division by zero here")

    with pytest.raises(ToolError) as excinfo:
        await boom.acall({})
    assert type(excinfo.value) is ToolError
    assert "ZeroDivisionError" in str(excinfo.value)
    assert "division by zero here" in str(excinfo.value)
    assert isinstance(excinfo.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize("timeout", [30.0, None])
async def test_tool_raising_timeout_error_is_not_a_timeout(timeout: float | None) -> None:
    @tool(timeout=timeout)
    def fetch() -> str:
        """Fetch."""
        raise TimeoutError("upstream socket timed out")

    with pytest.raises(ToolError, match="raised TimeoutError: upstream socket") as excinfo:
        await fetch.acall({})
    assert not isinstance(excinfo.value, ToolTimeoutError)


@pytest.mark.parametrize("is_async", [False, True])
async def test_infra_error_passes_through_unwrapped(is_async: bool) -> None:
    def fail() -> str:
        """Fail."""
        raise SandboxError("daemon gone")

    async def afail() -> str:
        """Fail."""
        raise SandboxError("daemon gone")

    broken = tool(afail if is_async else fail)
    with pytest.raises(SandboxError, match="daemon gone") as excinfo:
        await broken.acall({})
    assert type(excinfo.value) is SandboxError


async def test_tool_error_raised_by_tool_is_kept() -> None:
    @tool
    def picky() -> str:
        """Picky."""
        raise ToolError("say please")

    with pytest.raises(ToolError, match="^say please$"):
        await picky.acall({})


def test_example_arguments_cover_optional_and_union_required_parameters() -> None:
    @tool
    def find(n: Optional[int], key: int | str, mode: Literal["a", "b"]) -> str:  # noqa: UP045
        """Find."""
        return ""

    example = example_arguments(find.parameters)
    assert example == {"n": 1, "key": 1, "mode": "a"}
    find.validate(example)

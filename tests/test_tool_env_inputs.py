"""Bad arguments to `ToolEnv`, `tool` and its hooks are one-line `ConfigError`s; tool results
are rendered as text or valid JSON, never as a Python repr."""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import pydantic
import pytest

from agentgym import ConfigError, Rubric, ToolEnv, tool
from agentgym._tool_results import format_result

TASKS = [{"prompt": "What is 2 + 3?", "answer": "5"}]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def says_answer(completion: str, answer: str) -> float:
    return float(answer in completion)


def one_line_config_error(make: Any, match: str) -> str:
    """Run ``make``; it must raise a single-line `ConfigError` matching ``match``."""
    with pytest.raises(ConfigError, match=match) as excinfo:
        make()
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


# --- ToolEnv(...) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "shown"),
    [(None, "got None"), (3, "got int 3"), ({"add": add}, "got dict"), ("add", "got str 'add'")],
)
def test_tools_that_are_not_a_list_are_named(tools: Any, shown: str) -> None:
    message = one_line_config_error(lambda: ToolEnv(tools, tasks=TASKS), "tools must be a list")
    assert shown in message and "tools=[...]" in message


def test_a_tools_item_that_is_not_a_function_is_named() -> None:
    one_line_config_error(lambda: ToolEnv([add, "search"]), r"needs a function.*got str 'search'")


def test_one_task_dict_instead_of_a_list_says_to_wrap_it() -> None:
    message = one_line_config_error(
        lambda: ToolEnv([add], tasks=TASKS[0]), r"tasks must be a list of task dicts, got dict"
    )
    assert "wrap it in a list" in message  # was KeyError: 0 at reset


@pytest.mark.parametrize("tasks", [None, 7, "What is 2 + 3?"])
def test_tasks_that_cannot_be_indexed_are_refused(tasks: Any) -> None:
    one_line_config_error(lambda: ToolEnv([add], tasks=tasks), "tasks must be a list of task")


def test_a_task_that_is_not_a_dict_is_named_with_its_index() -> None:
    one_line_config_error(lambda: ToolEnv([add], tasks=["hi"]), r"task 0 is a str 'hi', not a dict")
    env = ToolEnv([add], tasks=[TASKS[0], "oops"])  # a later task: refused when picked
    env.reset(options={"task": 0})
    one_line_config_error(lambda: env.reset(options={"task": 1}), r"task 1 is a str 'oops'")


@pytest.mark.parametrize("rubric", [[says_answer], says_answer, {"says": says_answer}])
def test_a_rubric_that_is_not_a_rubric_is_refused_at_construction(rubric: Any) -> None:
    one_line_config_error(
        lambda: ToolEnv([add], tasks=TASKS, rubric=rubric),
        r"rubric must be an agentgym.Rubric, got .*rubric=Rubric\(\[fn, \.\.\.\]\)",
    )
    env = ToolEnv([add], tasks=TASKS, rubric=Rubric([says_answer]))  # the fix works
    env.reset()
    assert env.step("It is 5.")[1] == 1.0


class StrPromptEnv(ToolEnv):
    def build_prompt(self, task: dict[str, Any]) -> Any:
        return task["prompt"]


class DictsWithoutRolesEnv(ToolEnv):
    def build_prompt(self, task: dict[str, Any]) -> Any:
        return [{"content": task["prompt"]}]


@pytest.mark.parametrize("env_type", [StrPromptEnv, DictsWithoutRolesEnv])
def test_build_prompt_must_return_messages_and_the_error_names_the_hook(env_type: type) -> None:
    env = env_type([add], tasks=TASKS)
    one_line_config_error(
        env.reset, rf"{env_type.__name__}\.build_prompt must return a list of messages"
    )


@pytest.mark.parametrize("timeout", [0, -1, math.nan, "30"])
def test_tool_timeout_of_the_env_must_be_positive(timeout: Any) -> None:
    # None keeps each tool's own timeout (30 s by default): "None for no limit" misled
    said = one_line_config_error(
        lambda: ToolEnv([add], tool_timeout=timeout), rf"tool_timeout must be .* got {timeout!r}"
    )
    assert "or None for each tool's own timeout" in said, said


def test_a_reward_error_through_the_sync_adapter_is_its_own_traceback_alone() -> None:
    """Not chained to the adapter's "no running event loop" ("During handling of the above
    exception, another exception occurred"), which sent readers to the wrong place."""

    def judge(completion: str) -> float:
        raise ValueError("no score")

    env = ToolEnv([add], tasks=TASKS, rubric=Rubric([judge]))
    env.reset(seed=0)
    *_, info = env.step("The answer is 5.")
    shown = info["reward_errors"]["judge"]
    assert shown.endswith("ValueError: no score\n") and "event loop" not in shown, shown


# --- tool(...) -------------------------------------------------------------------------------


def ping() -> str:
    """Reply pong."""
    return "pong"


@pytest.mark.parametrize("timeout", [0, -1, -0.5, math.nan, True])
def test_tool_timeout_must_be_positive_seconds_or_none(timeout: Any) -> None:
    one_line_config_error(lambda: tool(timeout=timeout)(ping), r"timeout must be .* > 0, or None")


def test_positive_and_none_timeouts_are_kept() -> None:
    assert tool(timeout=0.5)(ping).timeout == 0.5
    assert tool(timeout=None)(ping).timeout is None


def test_tool_on_a_method_in_a_class_body_says_to_bind_it() -> None:
    def define() -> None:
        class Counter:
            @tool
            def bump(self, by: int) -> int:
                """Bump."""
                return by

    one_line_config_error(define, r"parameter 'self'.*plain function.*tool\(obj\.bump\)")


async def test_a_bound_method_is_a_tool_with_its_object() -> None:
    class Counter:
        def __init__(self) -> None:
            self.total = 0

        def bump(self, by: int) -> int:
            """Add to the total."""
            self.total += by
            return self.total

    counter = Counter()
    bump = tool(counter.bump)
    assert list(bump.parameters["properties"]) == ["by"] and bump.name == "bump"
    assert await bump.acall({"by": 2}) == 2 and counter.total == 2


class Scale:
    """A tool that holds state: the factor."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    def __call__(self, x: int) -> int:
        """Scale a number.

        Args:
            x: the number.
        """
        return self.factor * x


class AsyncScale(Scale):
    async def __call__(self, x: int) -> int:  # type: ignore[override]
        """Scale a number, asynchronously."""
        return self.factor * x


async def test_a_callable_object_is_described_by_its_call_method() -> None:
    scale = tool(Scale(3))
    assert scale.name == "Scale" and scale.description == "Scale a number."
    assert scale.parameters["properties"] == {
        "x": {"type": "integer", "description": "the number."}
    }
    assert await scale.acall({"x": 2}) == 6
    named = tool(name="scale_async")(AsyncScale(4))
    assert named.is_async and named.name == "scale_async" and await named.acall({"x": 2}) == 8


@pytest.mark.parametrize(
    "thing",
    [Scale, functools.partial(add.fn, 1), len, "add"],
    ids=["class", "partial", "builtin", "str"],
)
def test_what_has_no_signature_to_read_is_refused(thing: Any) -> None:
    one_line_config_error(lambda: tool(thing), r"tool\(\) needs a function.*wrap it in a def")


async def _numbers_async(n: int) -> Any:
    """Yield numbers."""
    for i in range(n):
        yield i


def _numbers(n: int) -> Any:
    """Yield numbers."""
    yield from range(n)


@pytest.mark.parametrize("fn", [_numbers_async, _numbers], ids=["async", "sync"])
def test_generator_functions_are_refused_at_decoration(fn: Any) -> None:
    one_line_config_error(lambda: tool(fn), r"is a generator function.*return them")


# --- format_result ---------------------------------------------------------------------------


class Person(pydantic.BaseModel):
    name: str
    age: int
    raw: bytes = b"ok"


def strict_json(text: str) -> Any:
    """Parse ``text`` as JSON proper: NaN and Infinity are not JSON."""
    return json.loads(text, parse_constant=lambda word: pytest.fail(f"{word} in {text}"))


def test_bytes_are_text_when_utf8_else_a_note_of_their_length() -> None:
    assert format_result("héllo".encode()) == "héllo"
    assert format_result(bytearray(b"abc")) == "abc"
    assert format_result(b"\x00\xffabc") == "<5 bytes of binary data, not UTF-8 text>"
    nested = strict_json(format_result({"data": b"\xff\xfe", "text": b"hi"}))
    assert nested == {"data": "<2 bytes of binary data, not UTF-8 text>", "text": "hi"}


def test_a_pydantic_model_is_written_as_its_json() -> None:
    person = Person(name="a", age=3)
    assert strict_json(format_result(person)) == {"name": "a", "age": 3, "raw": "ok"}
    in_list = strict_json(format_result([person, Person(name="b", age=4, raw=b"\xff")]))
    assert in_list[1] == {"name": "b", "age": 4, "raw": "<1 bytes of binary data, not UTF-8 text>"}


def test_numpy_and_torch_numbers_and_arrays_are_numbers_and_lists() -> None:
    """Not their str in quotes (``"3"``, ``"[1 2]"``): the model read text where numbers were."""
    import numpy as np
    import torch

    value = {"count": np.int64(3), "mean": np.float32(1.5), "flag": np.bool_(True),
             "rows": np.array([[1, 2], [3, 4]]), "logits": torch.tensor([0.5, 2.0])}  # fmt: skip
    assert strict_json(format_result(value)) == {
        "count": 3, "mean": 1.5, "flag": True, "rows": [[1, 2], [3, 4]], "logits": [0.5, 2.0]
    }
    assert format_result(np.int64(3)) == "3" and format_result(np.array([1, 2])) == "[1, 2]"


def test_floats_json_has_no_number_for_are_strings_in_valid_json() -> None:
    value = {"nan": math.nan, "inf": [math.inf, -math.inf], "ok": 1.5, "text": "NaN stays"}
    assert strict_json(format_result(value)) == {
        "nan": "NaN", "inf": ["Infinity", "-Infinity"], "ok": 1.5, "text": "NaN stays",
    }  # fmt: skip
    assert strict_json(format_result(math.nan)) == "NaN"


def test_str_int_and_json_results_are_as_before() -> None:
    assert format_result("NaN and b'x'") == "NaN and b'x'"
    assert format_result(7) == "7"
    assert format_result({"a": [1, "é"]}) == '{"a": [1, "é"]}'
    assert format_result([1.5, None, True]) == "[1.5, null, true]"


async def test_a_result_too_large_to_print_or_holding_surrogates_is_a_tool_message() -> None:
    """A model's arguments made ``power`` return 10**20000: `str` refuses ints past 4,300
    digits and the episode ended ``error`` (the model chose its class). A file name decoded
    with ``os.fsdecode`` holds lone surrogates: the episode ended ``ok``, then writing it to
    JSONL killed the eval and the training run."""
    import os

    import agentgym
    from agentgym._trajectory import to_json_line

    @tool
    def power(base: int, exp: int) -> int:
        """Raise base to exp."""
        return int(base) ** int(exp)

    @tool
    def file_name(name: str) -> str:
        """The name of a file as the file system holds it."""
        return os.fsdecode(name.encode("latin-1"))

    env = ToolEnv([power, file_name], tasks=TASKS)
    await env.areset()
    call = '<tool_call>{"name": "power", "arguments": {"base": 10, "exp": 20000}}</tool_call>'
    new_messages, *_ = await env.astep(call)
    said = new_messages[1]["content"]
    assert said.startswith("Error: 'power' returned a value too large to write as text")
    call = '<tool_call>{"name": "file_name", "arguments": {"name": "café.txt"}}</tool_call>'
    new_messages, *_ = await env.astep(call)
    assert new_messages[1]["content"] == "caf\\udce9.txt"
    line = to_json_line(agentgym.Trajectory(env_id="e", messages=new_messages))
    assert line.encode("utf-8")  # it writes: no UnicodeEncodeError


async def test_a_tool_returning_a_model_sends_its_json_to_the_model() -> None:
    @tool
    def who(name: str) -> Person:
        """Look a person up."""
        return Person(name=name, age=3)

    env = ToolEnv([who], tasks=TASKS)
    await env.areset()
    call = '<tool_call>{"name": "who", "arguments": {"name": "Ada"}}</tool_call>'
    new_messages, *_ = await env.astep(call)
    assert strict_json(new_messages[1]["content"]) == {"name": "Ada", "age": 3, "raw": "ok"}

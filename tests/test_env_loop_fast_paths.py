"""The env loop's fast paths give exactly what the plain code they replace gave.

Why: each step's cost was cut by writing a tool call's arguments with json's C encoder
directly (`agentgym._json.dumps`), copying observations with ``dict.copy`` (`json_copy`) and
reading a reward call's thread time in one system call (`_own_time`); a fast path that
changed a text, an error or the isolation of an observation would change what is trained.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest

import agentgym
from agentgym._env import json_copy
from agentgym._json import dumps
from agentgym._rubric import _RUSAGE_THREAD, _own_time

VALUES: list[Any] = [
    {"a": 6, "b": 7},
    {"city": "Zürich", "emoji": "😀", "quote": 'say "hi"\n', "slash": "</tool_call>"},
    {"nested": {"list": [1, 2.5, None, True, False, {"x": []}]}, "empty": {}},
    {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "big": 10**30, "float": 0.1},
    {1: "int key", 2.5: "float key", False: "bool key", None: "null key"},
    "a top-level string",
    [1, "two", [3]],
    42,
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_dumps_writes_what_json_dumps_writes(value: Any) -> None:
    assert dumps(value) == json.dumps(value, ensure_ascii=False)


def _circular() -> dict[str, Any]:
    value: dict[str, Any] = {"a": []}
    value["a"].append(value)
    return value


@pytest.mark.parametrize(
    "value",
    [{"when": object()}, {(1, 2): "tuple key"}, {"set": {1, 2}}, _circular()],
    ids=["object", "tuple-key", "set", "circular"],
)
def test_dumps_raises_what_json_dumps_raises(value: Any) -> None:
    with pytest.raises((TypeError, ValueError)) as expected:
        json.dumps(value, ensure_ascii=False)
    with pytest.raises(type(expected.value)) as got:
        dumps(value)
    assert str(got.value) == str(expected.value)


def test_dumps_recovers_after_a_circular_value() -> None:
    """Each call has its own record of the containers it is inside (not one shared)."""
    with pytest.raises(ValueError):
        dumps(_circular())
    shared = [1]
    assert dumps({"a": shared, "b": shared}) == '{"a": [1], "b": [1]}'


class _Dict(dict[str, Any]):
    pass


def test_json_copy_is_equal_plain_and_shares_nothing_mutable() -> None:
    inner = {"arguments": '{"a": 1}', "deep": [{"k": [1, 2]}]}
    value = [{"role": "assistant", "content": "x", "tool_calls": [inner]}, _Dict(a=[1])]
    copy = json_copy(value)
    assert copy == value
    assert type(copy[1]) is dict  # a subclass comes back a plain dict
    copy[0]["tool_calls"][0]["deep"][0]["k"].append(3)
    copy[0]["content"] = "changed"
    copy[1]["a"].append(2)
    assert inner["deep"] == [{"k": [1, 2]}] and value[0]["content"] == "x"
    assert value[1] == {"a": [1]}
    assert list(json_copy({"b": 1, "a": [1], "c": 2})) == ["b", "a", "c"]  # key order kept


def test_observations_cannot_change_the_episode() -> None:
    """A caller mutating what reset and step returned leaves the env's history as it was."""

    @agentgym.tool
    async def multiply(a: int, b: int) -> int:
        """Multiply.

        Args:
            a: one factor.
            b: the other.
        """
        return a * b

    env = agentgym.ToolEnv([multiply], tasks=[{"prompt": "6*7?", "answer": "42"}])
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    opening, info = env.reset(options={"task": 0})
    stepped = env.step(call)[0]
    before = json.dumps(env.messages)
    opening[0]["content"] = "changed"
    info["task"]["answer"] = "changed"
    stepped[0]["tool_calls"][0]["function"]["name"] = "changed"
    stepped[1]["content"] = "changed"
    assert json.dumps(env.messages) == before
    assert env.state.task == {"prompt": "6*7?", "answer": "42"}
    assert stepped[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 6, "b": 7}'


@pytest.mark.skipif(_RUSAGE_THREAD is None, reason="no per-thread usage on this platform")
def test_own_time_counts_the_threads_cpu_as_thread_time_does() -> None:
    cpu_before, thread_before = _own_time()[0], time.thread_time()
    end = time.thread_time() + 0.05
    while time.thread_time() < end:  # burn 50 ms of this thread's CPU
        pass
    burnt = time.thread_time() - thread_before
    counted = _own_time()[0] - cpu_before
    assert abs(counted - burnt) < 0.01, (counted, burnt)


def test_dumps_without_the_c_encoder_writes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentgym._json

    monkeypatch.setattr(agentgym._json, "_make_encoder", None)
    for value in VALUES:
        assert dumps(value) == json.dumps(value, ensure_ascii=False)

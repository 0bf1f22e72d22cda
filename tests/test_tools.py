"""`agentgym.tool`: schemas from hints and docstrings, validation, injection, timeouts, errors."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from datetime import date
from typing import Any, Literal, Optional

import pytest

from agentgym import (
    ConfigError,
    SandboxError,
    Tool,
    ToolArgumentsError,
    ToolError,
    ToolTimeoutError,
    _tool_calls,
    tool,
)
from agentgym._tool_calls import ToolThreads
from agentgym._tool_schema import example_arguments


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
def paint_all(
    colors: list[Color],
    by_name: dict[str, Color],
    maybe: Optional[list[Color]] = None,  # noqa: UP045
    either: int | Color = 0,
) -> str:
    """Paint several."""
    return repr((colors, by_name, maybe, either))


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (
            {"colors": ["red", "blue"], "by_name": {"sky": "blue"}},
            ([Color.RED, Color.BLUE], {"sky": Color.BLUE}, None, 0),
        ),
        (
            {"colors": [], "by_name": {}, "maybe": ["red"], "either": "blue"},
            ([], {}, [Color.RED], Color.BLUE),
        ),
        ({"colors": [], "by_name": {}, "maybe": None, "either": 7}, ([], {}, None, 7)),
    ],
    ids=["list-and-dict", "optional-list-and-union-member", "null-and-union-int"],
)
async def test_enums_inside_containers_and_unions_arrive_as_members(
    arguments: dict, expected: tuple
) -> None:
    assert await paint_all.acall(arguments) == repr(expected)


@pytest.mark.parametrize("error", [ValueError, KeyError, RuntimeError])
async def test_failing_conversion_is_an_arguments_error(error: type[Exception]) -> None:
    calls = []

    def convert(value: object) -> object:
        raise error("cannot convert")

    @tool
    def echo(text: str) -> str:
        """Echo."""
        calls.append(text)
        return text

    picky = dataclasses.replace(echo, converters={"text": convert})
    with pytest.raises(ToolArgumentsError, match=f"echo.*{error.__name__}") as excinfo:
        await picky.acall({"text": "x"})
    assert isinstance(excinfo.value.__cause__, error)
    assert calls == []


def test_abc_sequence_hint_is_an_array() -> None:
    @tool
    def total(values: Sequence[int]) -> int:
        """Total."""
        return sum(values)

    assert total.parameters["properties"]["values"] == {
        "type": "array",
        "items": {"type": "integer"},
    }


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
        release.set()  # end the abandoned worker thread now rather than in 5 s


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


# ---- cancellation and the threads of sync tools ----------------------------------------------


@tool(timeout=2.0)
def quick() -> str:
    """Return at once."""
    return "quick"


@pytest.mark.parametrize("how", ["cancelled", "timed out"])
async def test_async_tool_is_cancelled_and_finished_before_acall_returns(how: str) -> None:
    started, never = asyncio.Event(), asyncio.Event()
    seen: list[str] = []

    @tool(timeout=0.2 if how == "timed out" else None)
    async def slow() -> str:
        """Slow."""
        started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            await asyncio.sleep(0)  # cleanup that itself awaits (closing a connection ...)
            seen.append("cleaned up")
            raise
        return "never"

    call = asyncio.ensure_future(slow.acall({}))
    await started.wait()
    if how == "cancelled":
        call.cancel()
    with pytest.raises(asyncio.CancelledError if how == "cancelled" else ToolTimeoutError):
        await call
    assert seen == ["cancelled", "cleaned up"]


async def test_queue_time_is_not_part_of_the_timeout() -> None:
    threads = ToolThreads(1)

    @tool(timeout=3.0)
    def work() -> str:
        """Hold the only thread for longer than quick_call's timeout."""
        time.sleep(1.0)
        return "worked"

    # 0.5 s (was 0.25) for the quick call's own run once it has the thread: milliseconds
    # idle, but a thread's wake-up can lag on a saturated machine
    quick_call = dataclasses.replace(quick, timeout=0.5)
    start = time.perf_counter()
    results = await asyncio.gather(
        work.acall({}, threads=threads), quick_call.acall({}, threads=threads)
    )
    assert results == ["worked", "quick"]
    assert time.perf_counter() - start >= 1.0  # the quick call did wait its turn


@pytest.mark.parametrize("how", ["cancelled", "timed out"])
async def test_abandoned_sync_call_frees_its_thread_slot_at_once(how: str) -> None:
    threads, release, started = ToolThreads(1), threading.Event(), threading.Event()

    @tool(timeout=0.2 if how == "timed out" else None)
    def hang() -> str:
        """Hang."""
        started.set()
        release.wait(10)
        return "late"

    try:
        call = asyncio.ensure_future(hang.acall({}, threads=threads))
        assert await asyncio.to_thread(started.wait, 5)
        if how == "cancelled":
            call.cancel()
        with pytest.raises(asyncio.CancelledError if how == "cancelled" else ToolTimeoutError):
            await call
        start = time.perf_counter()
        assert await quick.acall({}, threads=threads) == "quick"
        assert time.perf_counter() - start < 1.0
        assert not release.is_set()  # the hanging thread still runs: it just no longer counts
    finally:
        release.set()


async def test_call_cancelled_while_waiting_for_a_thread_never_runs() -> None:
    threads, release, started = ToolThreads(1), threading.Event(), threading.Event()
    ran: list[str] = []

    @tool(timeout=None)
    def hold() -> str:
        """Hold the only thread."""
        started.set()
        release.wait(10)
        return "held"

    @tool
    def waiter() -> str:
        """Record that it ran."""
        ran.append("waiter")
        return "ran"

    try:
        holding = asyncio.ensure_future(hold.acall({}, threads=threads))
        assert await asyncio.to_thread(started.wait, 5)
        queued = [asyncio.ensure_future(waiter.acall({}, threads=threads)) for _ in range(2)]
        await asyncio.sleep(0)  # both take their first step: waiting for the thread
        queued[0].cancel()
        release.set()
        assert await holding == "held"
        assert await queued[1] == "ran"
        with pytest.raises(asyncio.CancelledError):
            await queued[0]
        assert ran == ["waiter"]  # the cancelled one never ran
    finally:
        release.set()


def test_tool_threads_size_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="size"):
        ToolThreads(0)


# ---- how calls run: async tools in the caller's task, sync tools on warm threads -------------


async def test_async_tool_that_never_waits_runs_without_a_task_of_its_own() -> None:
    caller = asyncio.current_task()

    @tool
    async def where() -> bool:
        """Whose task runs this call."""
        return asyncio.current_task() is caller

    assert await where.acall({}) is True


async def test_async_tool_context_changes_stay_in_the_call() -> None:
    seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="caller")

    @tool
    async def mark() -> str:
        """Set the variable, wait, read it back."""
        seen.set("tool")
        await asyncio.sleep(0)
        return seen.get()

    assert await mark.acall({}) == "tool"
    assert seen.get() == "caller"


async def test_async_tool_timeout_counts_from_the_call_not_from_its_first_wait() -> None:
    @tool(timeout=0.3)
    async def slow_start() -> str:
        """Compute for 0.25 s, then wait 0.2 s: over the timeout in total."""
        time.sleep(0.25)
        await asyncio.sleep(0.2)
        return "late"

    start = time.perf_counter()
    with pytest.raises(ToolTimeoutError):
        await slow_start.acall({})
    assert time.perf_counter() - start < 1.0


async def test_async_tool_that_swallows_the_timeout_still_timed_out() -> None:
    @tool(timeout=0.1)
    async def stubborn() -> str:
        """Ignore the cancellation and answer."""
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "ignored"
        return "slept"

    with pytest.raises(ToolTimeoutError):
        await stubborn.acall({})


async def test_async_tool_raising_timeout_error_after_waiting_is_not_a_timeout() -> None:
    @tool(timeout=5.0)
    async def upstream() -> str:
        """Fail like a client whose own timeout fired."""
        await asyncio.sleep(0)
        raise TimeoutError("upstream socket timed out")

    with pytest.raises(ToolError, match="raised TimeoutError: upstream") as excinfo:
        await upstream.acall({})
    assert not isinstance(excinfo.value, ToolTimeoutError)


async def test_sync_calls_reuse_a_warm_thread() -> None:
    @tool
    def where() -> threading.Thread:
        """Where."""
        return threading.current_thread()

    threads = ToolThreads(4)
    parked = max(len(_tool_calls._workers.idle), 1)  # idle workers once the call's is back
    first = await where.acall({}, threads=threads)
    deadline = time.monotonic() + 5  # the worker settles the call, then parks itself
    while len(_tool_calls._workers.idle) < parked:
        assert time.monotonic() < deadline, "the worker never went back to idle"
        await asyncio.sleep(0.005)
    assert await where.acall({}, threads=threads) is first
    assert first is not threading.current_thread()


async def test_idle_worker_threads_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tool_calls, "IDLE_THREAD_SECONDS", 0.05)
    gate = threading.Barrier(3)

    met: list[threading.Thread] = []

    @tool
    def meet() -> str:
        """Hold a thread until three calls run at once."""
        met.append(threading.current_thread())
        gate.wait(5)
        return "met"

    await asyncio.gather(*(meet.acall({}) for _ in range(3)))
    assert len(set(met)) == 3  # three worker threads (they may have exited already: 0.05 s)
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in met):
        assert time.monotonic() < deadline, "idle worker threads did not exit"
        await asyncio.sleep(0.02)


async def test_episodes_run_their_sync_calls_in_parallel() -> None:
    @tool
    def slow(x: int) -> int:
        """Sleep 0.2 s.

        Args:
            x: echoed.
        """
        time.sleep(0.2)
        return x

    envs = [ToolThreads() for _ in range(64)]  # one per env, as ToolEnv has
    start = time.perf_counter()
    results = await asyncio.gather(*(slow.acall({"x": i}, threads=t) for i, t in enumerate(envs)))
    assert results == list(range(64))
    assert time.perf_counter() - start < 1.2  # 64 at once, not 8 at a time (1.6 s)


def _sync_call_in_child(queue: multiprocessing.Queue[Any]) -> None:
    queue.put(asyncio.run(quick.acall({})))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
async def test_sync_tool_works_in_a_forked_child() -> None:
    assert await quick.acall({}) == "quick"  # the parent now has an idle worker
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_sync_call_in_child, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=10) == "quick"  # not handed to a parent's thread
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def test_a_raw_schema_is_checked_each_time_and_validates_like_jsonschema() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}},
              "required": ["n"]}  # fmt: skip
    first, second = (Tool(lambda n: n, "f", "", dict(schema)) for _ in range(2))
    for t in (first, second):  # the second is built from the cached check of the first
        t.validate({"n": 2})
        with pytest.raises(ToolArgumentsError, match="n: 0 is less than the minimum of 1"):
            t.validate({"n": 0})
    for _ in range(2):  # a broken schema is refused every time, not cached as checked
        with pytest.raises(ConfigError, match=r"^tool 'f': its parameters are not a JSON schema "
                           r"\(parameters/required: 'n' is not of type 'array'\)$"):  # fmt: skip
            Tool(lambda n: n, "f", "", {"type": "object", "required": "n"})
    dated = {"type": "object", "properties": {"d": {"type": "string", "default": date(2026, 1, 1)}}}
    Tool(lambda d: d, "g", "", dated).validate({"d": "2026-01-02"})  # not JSON: as is


@pytest.mark.parametrize(
    ("arguments", "where"),
    [
        ({"text": "a\ud800b"}, "arguments/text"),
        ({"text": "é", "numbers": [1], "weights": {"\udfff": 1.0}}, "arguments/weights (a name)"),
        ({"text": "ok", "items": ["x", "\ud83d"]}, "arguments/items/1"),
    ],
)
def test_a_lone_surrogate_in_the_arguments_is_the_models_error(arguments, where) -> None:
    # JSON spells one as "\ud800"; passed on, a sandbox or server fails to encode it, which
    # would count as the service failing (infra_error: the episode dropped, not scored)
    with pytest.raises(ToolArgumentsError, match="lone surrogate") as excinfo:
        everything.validate(arguments)
    assert where in str(excinfo.value)
    everything.validate(  # text outside ASCII is fine, as is a surrogate pair's character
        {"text": "é 😀", "count": 1, "ratio": 0.5, "flag": True, "numbers": [1],
         "weights": {"ü": 1.0}, "mode": "fast", "color": "red"}
    )  # fmt: skip

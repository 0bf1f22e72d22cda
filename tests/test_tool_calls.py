"""How `ToolEnv` runs an episode's tool calls: cancellation, conversion errors, sync threads."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentgym import (
    SandboxError,
    ScriptedPolicy,
    Tool,
    ToolCall,
    ToolEnv,
    Trajectory,
    arollout,
    get_parser,
    rollout,
    tool,
)

HERMES = get_parser("hermes")


def turn(*calls: ToolCall) -> str:
    return HERMES.render("", list(calls))


def calls(name: str, count: int = 1) -> list[ToolCall]:
    return [ToolCall(name, {}) for _ in range(count)]


def episode_env(*tools: Tool) -> Callable[[], ToolEnv]:
    return lambda: ToolEnv(list(tools), tasks=[{"prompt": "go", "answer": "done"}])


def tool_replies(trajectory: Trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages if m["role"] == "tool"]


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test, so threads a test abandoned end with it."""
    event = threading.Event()
    yield event
    event.set()


def default_executor_size() -> int:
    """Threads of asyncio's default executor (what sync tools used to share) on this machine."""
    return min(32, (os.cpu_count() or 1) + 4)


# ---- cancellation (issue 6, item 3) -------------------------------------------------------------


class SlowTool:
    """An async tool that runs until cancelled, recording what it saw."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.seen: list[str] = []
        self.tool = tool(name="slow")(self.run)

    async def run(self) -> str:
        """Run until cancelled."""
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.seen.append("cancelled")
            await asyncio.sleep(0)  # cleanup that awaits, as releasing a sandbox does
            self.seen.append("cleaned up")
            raise
        return "never"


async def test_cancelling_the_rollout_cancels_the_running_tool_before_it_returns() -> None:
    slow = SlowTool()
    policy = ScriptedPolicy([turn(ToolCall("slow", {}))])
    task = asyncio.ensure_future(arollout(episode_env(slow.tool), policy, tasks=[0]))
    await slow.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert slow.seen == ["cancelled", "cleaned up"]  # nothing of the call runs on


async def test_infra_error_in_one_call_cancels_its_siblings() -> None:
    slow = SlowTool()

    @tool
    async def broken() -> str:
        """Fail once the sibling runs."""
        await slow.started.wait()
        raise SandboxError("sandbox gone")

    env = episode_env(slow.tool, broken)()
    await env.areset(options={"task": 0})
    with pytest.raises(SandboxError, match="sandbox gone"):
        await env.astep(turn(ToolCall("slow", {}), ToolCall("broken", {})))
    assert slow.seen == ["cancelled", "cleaned up"]
    await env.aclose()


async def test_cancelled_sync_tool_does_not_hold_the_episode(release: threading.Event) -> None:
    started = threading.Event()

    @tool(timeout=None)
    def stuck() -> str:
        """Block until released."""
        started.set()
        release.wait(10)
        return "late"

    policy = ScriptedPolicy([turn(ToolCall("stuck", {}))])
    task = asyncio.ensure_future(arollout(episode_env(stuck), policy, tasks=[0]))
    assert await asyncio.to_thread(started.wait, 30)  # a whole rollout first: room for load
    began = time.perf_counter()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.perf_counter() - began < 5.0  # ms idle; holding on would take the tool's 10 s
    assert not release.is_set()


# ---- argument conversion (item 7) ---------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@tool
def paint(colors: list[Color]) -> str:
    """Paint in the given colours."""
    return ",".join(c.name for c in colors)


def test_enum_list_argument_reaches_the_tool_as_members() -> None:
    env = episode_env(paint)()
    env.reset(options={"task": 0})
    messages, *_, info = env.step(turn(ToolCall("paint", {"colors": ["red", "blue"]})))
    assert messages[-1]["content"] == "RED,BLUE"
    assert info["tool_errors"] == []


def test_failing_conversion_is_a_tool_message_not_a_crash() -> None:
    def refuse(value: Any) -> Any:
        raise LookupError("no such colour today")

    picky = dataclasses.replace(paint, converters={"colors": refuse})
    env = episode_env(picky)()
    env.reset(options={"task": 0})
    messages, _, terminated, _, info = env.step(turn(ToolCall("paint", {"colors": ["red"]})))
    assert "LookupError: no such colour today" in messages[-1]["content"]
    assert messages[-1]["content"].startswith("Error: invalid arguments for 'paint'")
    assert len(info["tool_errors"]) == 1 and not terminated
    _, _, terminated, _, _ = env.step("done")  # the episode goes on
    assert terminated


@pytest.mark.parametrize("depth", [150, 5000])
def test_deep_arguments_in_a_server_parsed_message_are_the_models_error(depth: int) -> None:
    # a backend that parsed the calls (OpenAI message) hands arguments over as JSON text; 5000
    # levels raised RecursionError out of the step, and 150 parsed or not by stack depth
    from agentgym import Completion

    env = episode_env(paint)()
    env.reset(options={"task": 0})
    deep = '{"colors": ' + "[" * depth + "]" * depth + "}"
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "paint", "arguments": deep}}]}
    _, _, terminated, _, info = env.step(Completion(text="", message=message))
    assert not terminated and len(info["tool_errors"]) == 1
    assert "nested deeper than 100 levels" in info["tool_errors"][0]


# ---- the env's own threads for sync tools (item 9) ----------------------------------------------


def test_busy_machine_never_times_out_a_call_that_fits_its_timeout() -> None:
    @tool(timeout=1.5)
    def work() -> str:
        """Take one second."""
        time.sleep(1.0)
        return "worked"

    episodes = max(16, 2 * default_executor_size())  # more than a shared pool could hold
    policy = ScriptedPolicy([turn(ToolCall("work", {})), "done"])
    began = time.perf_counter()
    trajectories = rollout(
        episode_env(work), policy, tasks=[0], group_size=episodes, max_concurrency=episodes
    )
    replies = [reply for t in trajectories for reply in tool_replies(t)]
    assert replies == ["worked"] * episodes
    assert time.perf_counter() - began < 4.0  # the calls ran side by side


def test_hanging_calls_do_not_make_a_quick_call_time_out(release: threading.Event) -> None:
    @tool(timeout=0.2)
    def hang() -> str:
        """Block until released."""
        release.wait(10)
        return "late"

    @tool(timeout=5.0)  # under the hangs' 10 s, with room for a saturated machine
    def quick() -> str:
        """Return at once."""
        return "quick"

    hangs = default_executor_size()  # enough to fill a shared pool
    policy = ScriptedPolicy([turn(*calls("hang", hangs)), turn(ToolCall("quick", {})), "done"])
    [trajectory] = rollout(episode_env(hang, quick), policy, tasks=[0])
    replies = tool_replies(trajectory)
    assert all("timed out after 0.2 s" in r for r in replies[:hangs])
    assert replies[hangs:] == ["quick"]


def test_rollout_returns_without_waiting_for_an_abandoned_thread(
    release: threading.Event,
) -> None:
    @tool(timeout=0.2)
    def hang() -> str:
        """Block until released, at most 10 s."""
        release.wait(10)
        return "late"

    policy = ScriptedPolicy([turn(ToolCall("hang", {})), "done"])
    began = time.perf_counter()
    [trajectory] = rollout(episode_env(hang), policy, tasks=[0])
    assert time.perf_counter() - began < 3.0
    assert "timed out" in tool_replies(trajectory)[0]
    assert not release.is_set()


def test_a_tool_that_never_returns_does_not_keep_the_process_alive() -> None:
    script = textwrap.dedent(
        """
        import threading
        from agentgym import ScriptedPolicy, ToolCall, ToolEnv, get_parser, rollout, tool

        @tool(timeout=0.2)
        def hang() -> str:
            '''Never return.'''
            threading.Event().wait()

        text = get_parser("hermes").render("", [ToolCall("hang", {})])
        env = lambda: ToolEnv([hang], tasks=[{"prompt": "go"}])
        [t] = rollout(env, ScriptedPolicy([text, "done"]), tasks=[0])
        print(t.status, [m["content"] for m in t.messages if m["role"] == "tool"])
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok") and "timed out after 0.2 s" in proc.stdout

"""Cancelling an env's call where it awaits: what it held is let go, and nothing of it runs on.

Each test parks the call at one await with a gate (a sync tool that waits on an event), cancels
it there (Ctrl-C, as a user does), and checks that the call is over and the env goes on.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentgym import ConfigError, ToolEnv, tool
from agentgym._env import _thread_loop
from tests.conftest import ctrl_c_when

CALL = '<tool_call>{"name": "wait", "arguments": {}}</tool_call>'




class GatedEnv(ToolEnv):
    """A `ToolEnv` whose one tool waits for `release`; counts its teardowns."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.teardowns = 0

        @tool(timeout=None)
        def wait() -> str:
            """Wait until released."""
            self.entered.set()
            self.release.wait(30)
            return "the interrupted call's result"

        super().__init__([wait], tasks=[{"prompt": "first"}, {"prompt": "second"}])

    async def teardown_episode(self) -> None:
        self.teardowns += 1


def test_ctrl_c_in_a_sync_step_does_not_resume_in_the_next_episode() -> None:
    """Old: the interrupted step stayed pending on the env's loop; the next sync call ran
    that loop and so resumed it, writing its tool call and result into the next episode."""
    env = GatedEnv()
    env.reset(options={"task": 0})
    with ctrl_c_when(env.entered, _thread_loop()), pytest.raises(KeyboardInterrupt):
        env.step(CALL)
    assert not asyncio.all_tasks(_thread_loop())  # the step is over, not parked
    env.release.set()

    env.reset(options={"task": 1})
    _, _, terminated, _, _ = env.step("my answer")
    assert terminated
    contents = [m["content"] for m in env.messages if m["role"] != "system"]
    assert contents == ["second", "my answer"]
    env.close()


def test_ctrl_c_in_a_sync_step_inside_a_running_loop_lets_the_env_close() -> None:
    """A notebook cell (a running loop, no asyncio SIGINT handler): old, the interrupted step
    ran on beside the cell and every later sync call was refused, ``close`` included, until
    it ended (never, for a call without a timeout): its resources were never released."""
    env = GatedEnv()

    async def cell() -> None:
        env.reset(options={"task": 0})
        with ctrl_c_when(env.entered), pytest.raises(KeyboardInterrupt):
            env.step(CALL)  # the cell waits for a helper thread that runs the step
        env.close()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(cell())
    finally:
        env.release.set()
        loop.close()
    assert env.teardowns == 1


def test_a_step_cancelled_while_its_tools_run_ends_what_the_episode_can_do() -> None:
    """Old: its turn counted but its messages were never added, and a next step went on as if
    the cut turn had never been played (the model's call and its result lost)."""
    env = GatedEnv()

    async def play() -> None:
        await env.areset(options={"task": 0})
        step = asyncio.ensure_future(env.astep(CALL))
        assert await asyncio.to_thread(env.entered.wait, 30)  # the step waits in its tool
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        with pytest.raises(ConfigError, match=r"last step was cut short .*call reset\(\) first"):
            await env.astep("my answer")
        env.release.set()
        await env.areset(options={"task": 1})
        *_, terminated, _, _ = await env.astep("my answer")
        assert terminated
        await env.aclose()

    asyncio.run(play())
    assert env.teardowns == 2  # the cut episode's too, at the reset


def test_a_step_cut_short_cannot_be_truncated_either() -> None:
    """`atruncate` scored such an episode without the cut turn's messages."""
    env = GatedEnv()

    async def play() -> None:
        await env.areset(options={"task": 0})
        step = asyncio.ensure_future(env.astep(CALL))
        assert await asyncio.to_thread(env.entered.wait, 30)
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        with pytest.raises(ConfigError, match="last step was cut short"):
            await env.atruncate()
        env.release.set()
        await env.aclose()

    asyncio.run(play())


def test_a_sync_call_whose_helper_thread_cannot_start_raises_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside a running loop: it waited forever for a thread that never ran."""
    env = GatedEnv()

    def cannot_start(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    async def cell() -> None:
        monkeypatch.setattr(threading.Thread, "start", cannot_start)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            env.reset(options={"task": 0})
        monkeypatch.undo()
        env.close()

    asyncio.run(cell())

"""Async tools that break asyncio's rules cannot hang or serialise a run.

A tool that swallows `asyncio.CancelledError` gets a short grace after its cancellation, then it
is closed where it waits: the model reads a timeout, the episode (and `rollout`, `arollout`'s
deadline) goes on. Cancellations a tool asks for itself (``asyncio.timeout`` inside it) stay its
own. A tool that blocks the event loop past its timeout is timed out all the same, and told why.
Wall-time bounds are generous (a loaded 2-core machine), and each wait that could regress into a
hang is bounded, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentgym import (
    Rubric,
    ScriptedPolicy,
    Tool,
    ToolEnv,
    ToolTimeoutError,
    Trajectory,
    arollout,
    rollout,
    tool,
)
from agentgym._tool_calls import CANCEL_GRACE_SECONDS

#: Slack on every wall-time bound: scheduling on a busy machine, not the behaviour tested.
SLACK = 2.0


class Stubborn:
    """An async tool body that swallows every cancellation: it never ends on its own.

    ``cancels`` counts the cancellations it swallowed; ``closed`` says it was closed (its
    ``finally`` ran); ``started`` is set once it waits. ``clinging``: its ``finally`` awaits
    too, so it ignores being closed as well. ``released`` makes it take the next cancellation
    (the `stubborn` fixture's, after a regression left it running).
    """

    def __init__(self, clinging: bool = False) -> None:
        self.started = asyncio.Event()
        self.cancels = 0
        self.closed = self.released = False
        self.clinging = clinging

    async def __call__(self) -> str:
        """Wait forever, ignoring cancellation."""
        self.started.set()
        try:
            while True:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    if self.released:
                        raise
                    self.cancels += 1
        finally:
            self.closed = True
            if self.clinging:
                await asyncio.sleep(0)  # being closed: "coroutine ignored GeneratorExit"


@pytest.fixture
async def stubborn() -> AsyncIterator[Stubborn]:
    """A `Stubborn`; afterwards, calls a regression left running are ended (or the loop's
    close would wait for them forever, hanging the suite)."""
    made = Stubborn()
    yield made
    made.released = True
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in left:
        task.cancel()
    if left:
        await asyncio.wait(left, timeout=5)


async def within(seconds: float, awaitable: Any) -> asyncio.Future[Any]:
    """``awaitable`` as a task that must end within ``seconds``: a regression fails, not hangs."""
    running = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({running}, timeout=seconds)
    assert done, f"still running after {seconds} s"
    return running


def warnings_about(caplog: pytest.LogCaptureFixture, name: str, what: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and name in r.getMessage() and what in r.getMessage()
    ]


# ---- a tool that ignores cancellation --------------------------------------------------------


async def test_a_tool_ignoring_its_timeout_is_timed_out_and_closed_after_a_short_grace(
    stubborn: Stubborn, caplog: pytest.LogCaptureFixture
) -> None:
    call = tool(stubborn, name="stubborn_timeout", timeout=0.3)
    ended = await within(0.3 + CANCEL_GRACE_SECONDS + SLACK, call.acall({}))
    with pytest.raises(ToolTimeoutError, match="'stubborn_timeout' timed out after 0.3 s"):
        ended.result()
    assert stubborn.cancels == 1  # it was cancelled, swallowed it,
    assert stubborn.closed  # and was closed: nothing of the call runs on
    assert warnings_about(caplog, "'stubborn_timeout'", "closed where it waited")


async def test_cancelling_a_call_whose_tool_ignores_it_ends_after_the_grace(
    stubborn: Stubborn,
) -> None:
    call = asyncio.ensure_future(tool(stubborn, name="stubborn_cancel", timeout=None).acall({}))
    await asyncio.wait_for(stubborn.started.wait(), 5)
    call.cancel()
    await within(CANCEL_GRACE_SECONDS + SLACK, call)
    assert call.cancelled() and stubborn.closed


async def _return_instead(_: asyncio.CancelledError) -> str:
    return "ignored"


async def _raise_instead(_: asyncio.CancelledError) -> str:
    raise ValueError("not a cancellation")


@pytest.mark.parametrize("instead", [_return_instead, _raise_instead])
async def test_a_cancelled_call_is_cancelled_whatever_its_tool_does_instead(instead: Any) -> None:
    started = asyncio.Event()

    @tool(timeout=None)
    async def defiant() -> str:
        """End its own way when cancelled."""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as cancelled:
            return await instead(cancelled)
        return "never"

    call = asyncio.ensure_future(defiant.acall({}))
    await asyncio.wait_for(started.wait(), 5)
    call.cancel()
    await within(5, call)
    assert call.cancelled()  # a deadline that cut the episode holds whatever the tool does


async def test_a_tool_that_awaits_even_while_being_closed_still_ends(stubborn: Stubborn) -> None:
    stubborn.clinging = True
    clinging = tool(stubborn, name="clinging", timeout=0.2)
    ended = await within(0.2 + CANCEL_GRACE_SECONDS + SLACK, clinging.acall({}))
    assert isinstance(ended.exception(), ToolTimeoutError)
    assert stubborn.closed


async def test_cancellations_a_tool_asks_for_itself_stay_its_own() -> None:
    """Its own ``asyncio.timeout`` fires, it recovers and waits past the grace: not closed."""

    @tool(timeout=CANCEL_GRACE_SECONDS + 5)
    async def patient() -> str:
        """Give up on one wait, then wait again, longer than the grace."""
        try:
            async with asyncio.timeout(0.05):
                await asyncio.Event().wait()
        except TimeoutError:
            await asyncio.sleep(CANCEL_GRACE_SECONDS + 0.3)
            return "recovered"
        return "never"

    ended = await within(CANCEL_GRACE_SECONDS + 0.3 + SLACK, patient.acall({}))
    assert ended.result() == "recovered"


def correct(completion: str, answer: str) -> float:
    return float(answer in completion)


def one_tool_env(only: Tool) -> Any:
    """A factory of envs with one task (answer ``a``) and one tool, ``only``."""
    return lambda: ToolEnv([only], tasks=[{"prompt": "p", "answer": "a"}], rubric=Rubric([correct]))


def stubborn_env(stubborn: Stubborn, timeout: float | None) -> Any:
    """`one_tool_env` of ``stubborn``, named ``stubborn``."""
    return one_tool_env(tool(stubborn, name="stubborn", timeout=timeout))


def call(name: str) -> str:
    """A turn calling tool ``name`` without arguments, in the hermes format."""
    return f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'


CALL_THEN_ANSWER = ScriptedPolicy([call("stubborn"), "a"])


def in_thread(seconds: float, run: Any) -> Any:
    """``run()`` on a thread that must end within ``seconds``: a regression fails, not hangs."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(run()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    return result[0]


def test_rollout_returns_when_a_tool_ignores_its_timeout(caplog: pytest.LogCaptureFixture) -> None:
    stubborn = Stubborn()
    env = stubborn_env(stubborn, 0.5)
    played: list[Trajectory] = in_thread(
        0.5 + CANCEL_GRACE_SECONDS + SLACK, lambda: rollout(env, CALL_THEN_ANSWER, group_size=2)
    )
    assert [(t.status, t.final_reward) for t in played] == [("ok", 1.0), ("ok", 1.0)]
    for trajectory in played:
        tool_message = next(m for m in trajectory.messages if m["role"] == "tool")
        assert tool_message["content"] == "Error: 'stubborn' timed out after 0.5 s"
    assert stubborn.closed
    assert len(warnings_about(caplog, "'stubborn'", "closed where it waited")) == 1


async def _ignore_cancellation_forever() -> None:
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass


def test_rollout_returns_past_a_task_left_behind_that_ignores_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tool's own background task (not the call) that swallows cancellation, kept forever."""
    kept: list[asyncio.Task[None]] = []

    @tool
    async def start_poller() -> str:
        """Start a background task and return."""
        loop = asyncio.get_running_loop()
        kept.append(loop.create_task(_ignore_cancellation_forever(), name="poller"))
        return "started"

    policy = ScriptedPolicy([call("start_poller"), "a"])
    played = in_thread(
        CANCEL_GRACE_SECONDS + SLACK, lambda: rollout(one_tool_env(start_poller), policy)
    )
    assert [(t.status, t.final_reward) for t in played] == [("ok", 1.0)]
    [left] = warnings_about(caplog, "poller (_ignore_cancellation_forever)", "left behind")
    assert "1 task(s)" in left
    assert not kept[0].done()  # left with its closed loop, as the warning says


async def test_the_deadline_cuts_an_episode_whose_tool_ignores_cancellation(
    stubborn: Stubborn,
) -> None:
    # 2 s: the episode must reach the tool before the deadline, on a loaded machine too
    cut = arollout(stubborn_env(stubborn, None), CALL_THEN_ANSWER, tasks=[0], deadline=2.0)
    played = (await within(2.0 + CANCEL_GRACE_SECONDS + SLACK, cut)).result()
    assert [(t.status, t.final_reward, len(t.turns)) for t in played] == [("late", None, 0)]
    assert stubborn.cancels == 1 and stubborn.closed


# ---- a tool that blocks the event loop -------------------------------------------------------


async def _block_at_once() -> str:
    time.sleep(0.5)  # the defect under test: a blocking call in an async tool
    return "done"


async def _block_after_a_wait() -> str:
    await asyncio.sleep(0)
    time.sleep(0.5)
    return "done"


async def _block_then_wait() -> str:
    time.sleep(0.5)
    await asyncio.sleep(0)
    return "done"


@pytest.mark.parametrize("body", [_block_at_once, _block_after_a_wait, _block_then_wait])
async def test_an_async_tool_blocking_the_loop_past_its_timeout_is_timed_out_and_told_why(
    body: Any, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"hog{body.__name__}"
    hog = tool(body, name=name, timeout=0.2)
    for _ in range(2):
        with pytest.raises(ToolTimeoutError) as excinfo:
            await hog.acall({})
        message = str(excinfo.value)
        assert message.startswith(f"'{name}' timed out after 0.2 s: it blocked the event loop")
        assert "plain `def`" in message
        blocked = float(message.split("blocked the event loop for ")[1].split(" s")[0])
        assert blocked >= 0.4  # ~0.5 s, rounded to 0.1
    assert len(warnings_about(caplog, name, "blocked the event loop")) == 1  # once per tool


async def test_a_timeout_not_caused_by_blocking_does_not_blame_the_tool() -> None:
    @tool(timeout=0.5)
    async def waits() -> str:
        """Block briefly (under half the timeout), then wait longer than the timeout."""
        time.sleep(0.15)
        await asyncio.sleep(5)
        return "late"

    with pytest.raises(ToolTimeoutError) as excinfo:
        await waits.acall({})
    assert str(excinfo.value) == "'waits' timed out after 0.5 s"


async def test_a_step_of_an_env_reports_the_blocking_tool_to_the_model() -> None:
    hog = tool(_block_at_once, name="env_hog", timeout=0.2)
    env = ToolEnv([hog], tasks=[{"prompt": "p"}])
    await env.areset(seed=0)
    messages, *_, info = await env.astep(call("env_hog"))
    assert messages[1]["content"].startswith("Error: 'env_hog' timed out after 0.2 s: it blocked")
    assert len(info["tool_errors"]) == 1

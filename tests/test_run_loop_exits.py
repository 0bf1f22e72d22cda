"""`rollout()`'s own event loop ends cleanly: after an exit raised in env code, past a stuck close.

- A SystemExit (env code calling ``sys.exit()``) or KeyboardInterrupt (a Ctrl-C landing in env
  code) reached the caller, and asyncio then printed "Task exception was never retrieved"
  with a second traceback, at garbage collection: the main task kept its copy, unread.
- An env whose close waited in ``asyncio.to_thread`` for a call that never returned (a Docker
  daemon that stopped answering) was left open after ``close_timeout``, but `rollout()` still
  never returned: its loop's close waited for that thread without a limit. Once it returned,
  the process still never exited: the interpreter joined that thread at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym import EnvPool, ScriptedPolicy, rollout
from agentgym._tool_calls import CANCEL_GRACE_SECONDS
from envs.calculator import CalculatorEnv


class ExitsInSetup(CalculatorEnv):
    """The calculator whose every episode setup calls ``sys.exit()`` (env code's mistake)."""

    async def setup_episode(self, task: dict[str, Any]) -> None:
        sys.exit("exit from env code")


class StuckClose(CalculatorEnv):
    """An env whose episode fails, so it is closed, and whose close waits in a thread.

    The thread waits until the test sets ``unblock``, as a Docker call waits for a daemon that
    stopped answering.
    """

    unblock = threading.Event()

    async def setup_episode(self, task: dict[str, Any]) -> None:
        raise RuntimeError("a broken task")

    async def aclose(self) -> None:
        await asyncio.to_thread(StuckClose.unblock.wait)
        await super().aclose()


def test_a_system_exit_in_env_code_reaches_the_caller_with_no_unretrieved_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each episode raises it: the first ends the rollout, and the next met its close."""
    agentgym.register("tests/ExitsInSetup-v0", ExitsInSetup)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with pytest.raises(SystemExit):
            rollout("tests/ExitsInSetup-v0", ScriptedPolicy(["<answer>1</answer>"]), num_tasks=2)
        gc.collect()  # the task that kept the exit is reported when it is collected
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "never retrieved" in m], said


@contextlib.contextmanager
def closes_stuck_until_the_end() -> Iterator[None]:
    """`StuckClose`'s closes stay stuck until the block ends, so no thread outlives the test.

    A 20 s timer frees them too: a safety net, not the sync (the old code returned only once
    the thread ended, so a failing test ends at 20 s instead of never).
    """
    StuckClose.unblock.clear()
    release = threading.Timer(20, StuckClose.unblock.set)
    release.daemon = True
    release.start()
    try:
        yield
    finally:
        StuckClose.unblock.set()
        release.cancel()


def test_a_close_stuck_in_a_thread_does_not_hang_the_end_of_rollout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = EnvPool(StuckClose, close_timeout=0.2)  # the failed episode's close is left at 0.2 s
    started = time.monotonic()
    with closes_stuck_until_the_end(), caplog.at_level(logging.WARNING, logger="agentgym"):
        played = rollout(pool, ScriptedPolicy(["<answer>1</answer>"]), num_tasks=1)
        elapsed = time.monotonic() - started
    assert [t.status for t in played] == ["error"]
    assert elapsed < 0.2 + CANCEL_GRACE_SECONDS + 5, elapsed
    said = [r.getMessage() for r in caplog.records]
    left = [m for m in said if "thread(s) of its event loop" in m]
    assert len(left) == 1 and "cannot be stopped" in left[0], said


#: A script that plays one episode whose env's close never returns from its thread.
_STUCK_CLOSE_SCRIPT = """
from agentgym import EnvPool, ScriptedPolicy, rollout
from tests.test_run_loop_exits import StuckClose

played = rollout(EnvPool(StuckClose, close_timeout=0.2), ScriptedPolicy(["<answer>1</answer>"]),
                 num_tasks=1)
print(played[0].status)
"""


def test_a_process_exits_past_a_close_stuck_in_a_thread_for_good() -> None:
    """The old process never exited: at exit the interpreter joined the executor's threads."""
    # 120 s: the old process never exited; this one takes 1.9 s idle, mostly imports, which a
    # saturated machine 10x slower in bursts could stretch past the 20 s given before
    try:
        done = subprocess.run([sys.executable, "-c", _STUCK_CLOSE_SCRIPT], capture_output=True,
                              text=True, timeout=120, cwd=Path(__file__).parent.parent)  # fmt: skip
    except subprocess.TimeoutExpired as exc:  # run() kills the child before raising
        pytest.fail(f"the process had not exited 120 s after it started; stderr:\n{exc.stderr!r}")
    assert (done.returncode, done.stdout.split()) == (0, ["error"]), done.stderr
    assert "thread(s) of its event loop" in done.stderr, done.stderr
    assert "abandoned when the interpreter exits" in done.stderr, done.stderr

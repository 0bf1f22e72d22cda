"""`EnvPool.aclose` gives each env's close a deadline, logs the one left open, closes the rest.

Why: an env whose close hung (a sandbox daemon that stopped answering, a server that would not
stop) hung the trainer's or eval's shutdown for good, and the envs after it were never closed.
The hung close here waits for a thread the way a sandbox's close does (`in_thread_to_the_end`),
so cancelling it does not end it: only a deadline of the pool's own does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from agentgym import ConfigError, EnvPool, Rubric, ToolEnv
from agentgym.sandboxes._protocol import in_thread_to_the_end


class HungCloseEnv(ToolEnv):
    """Its close waits in a thread until ``unblock`` is set, through every cancel."""

    def __init__(self, unblock: threading.Event, closed: list[str]) -> None:
        super().__init__([], tasks=[{"prompt": "p", "answer": "a"}], rubric=Rubric([]))
        self.unblock, self.closed = unblock, closed

    async def aclose(self) -> None:
        await in_thread_to_the_end(lambda: self.unblock.wait(60))
        self.closed.append("hung")


class PlainEnv(ToolEnv):
    def __init__(self, closed: list[str]) -> None:
        super().__init__([], tasks=[{"prompt": "p", "answer": "a"}], rubric=Rubric([]))
        self.closed = closed

    async def aclose(self) -> None:
        self.closed.append("plain")
        await super().aclose()


def test_a_hung_close_is_left_open_at_the_deadline_and_the_next_env_is_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unblock, closed = threading.Event(), []
    # the old pool waited for the hung close: it ends 20 s on, failing the time check below
    timer = threading.Timer(20, unblock.set)
    timer.daemon = True  # else it kept pytest alive 20 s after the tests had passed
    timer.start()

    async def main() -> float:
        pool = EnvPool(lambda: PlainEnv(closed), close_timeout=0.5)
        pool.idle = [HungCloseEnv(unblock, closed), PlainEnv(closed)]
        started = time.monotonic()
        await pool.aclose()
        elapsed = time.monotonic() - started
        unblock.set()  # lets the thread of the abandoned close end, so the loop can shut down
        return elapsed

    with caplog.at_level(logging.WARNING, logger="agentgym._rollout"):
        elapsed = asyncio.run(main())
    assert elapsed < 10, elapsed
    assert closed == ["plain"]  # the hung env was left open; the one after it was closed
    left_open = [r.getMessage() for r in caplog.records if "did not close" in r.getMessage()]
    assert left_open == [
        "a HungCloseEnv did not close within 0.5 s (close_timeout); left open, with what it "
        "holds, to close the next env"
    ]


def test_a_keyboard_interrupt_in_a_close_is_raised_by_aclose_not_by_the_loop() -> None:
    """Raised in the close's own task, it escaped the loop's run instead of the pool's close."""

    class InterruptedCloseEnv(PlainEnv):
        async def aclose(self) -> None:
            raise KeyboardInterrupt

    closed: list[str] = []

    async def main() -> str:
        pool = EnvPool(lambda: PlainEnv(closed))
        pool.idle = [InterruptedCloseEnv(closed)]
        try:
            await pool.aclose()
        except KeyboardInterrupt:
            return "aclose raised it"
        return "aclose returned"

    assert asyncio.run(main()) == "aclose raised it"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "30"])
def test_a_close_timeout_that_is_not_a_positive_number_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"close_timeout must be a finite number of seconds"):
        EnvPool(lambda: PlainEnv([]), close_timeout=bad)  # type: ignore[arg-type]

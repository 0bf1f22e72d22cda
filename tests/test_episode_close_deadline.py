"""An env closed after its episode (raised, cut, cancelled) gets the pool's close deadline.

Why: `EnvPool.aclose` bounded each close, but the close of an env whose episode failed ran
without a limit inside that episode: a close that hung (a sandbox daemon that stopped
answering, a server that would not stop) hung its episode, so ``arollout``, an eval and a
trainer step never returned. The hung close here waits for a thread, as a sandbox's does
(`in_thread_to_the_end`), so cancelling it does not end it: only a deadline of the engine's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from agentgym import (
    EnvPool,
    EpisodeSpec,
    Rubric,
    ScriptedPolicy,
    ToolEnv,
    _rollout,
    arollout,
    run_episode,
)
from agentgym.sandboxes._protocol import in_thread_to_the_end


class FailingEnvWithHungClose(ToolEnv):
    """Its reset raises, so the engine closes it; the close waits in a thread for ``unblock``."""

    def __init__(self, unblock: threading.Event, closed: list[str]) -> None:
        super().__init__([], tasks=[{"prompt": "p", "answer": "a"}], rubric=Rubric([]))
        self.unblock, self.closed = unblock, closed

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        raise RuntimeError("reset exploded")

    async def aclose(self) -> None:
        await in_thread_to_the_end(lambda: self.unblock.wait(60))
        self.closed.append("hung")


def _unblock_later() -> threading.Event:
    """An event set 20 s on: the old engine waited for the hung close until then."""
    unblock = threading.Event()
    timer = threading.Timer(20, unblock.set)
    timer.daemon = True
    timer.start()
    return unblock


def test_a_hung_close_after_a_failed_episode_does_not_hang_the_rollout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unblock, closed = _unblock_later(), []

    async def main() -> tuple[float, list[Any]]:
        pool = EnvPool(lambda: FailingEnvWithHungClose(unblock, closed), close_timeout=0.5)
        started = time.monotonic()
        trajectories = await arollout(pool, ScriptedPolicy(["a"]), tasks=[0], group_size=2,
                                      max_concurrency=1)  # fmt: skip
        elapsed = time.monotonic() - started
        unblock.set()  # lets the threads of the abandoned closes end, so the loop can shut down
        return elapsed, trajectories

    with caplog.at_level(logging.WARNING, logger="agentgym._rollout"):
        elapsed, trajectories = asyncio.run(main())
    assert elapsed < 10, elapsed  # two closes of 0.5 s each, not 20 s of waiting
    assert closed == []  # both left open at the deadline
    assert [t.status for t in trajectories] == ["error", "error"]  # the episode's own outcome
    expected = (
        "a FailingEnvWithHungClose did not close within 0.5 s (close_timeout); left open, "
        "with what it holds, to end its episode"
    )
    assert [t.info["close_error"] for t in trajectories] == [expected] * 2
    assert [r.getMessage() for r in caplog.records if "did not close" in r.getMessage()] == [
        expected
    ] * 2


def test_run_episode_closes_its_env_within_the_default_close_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`run_episode` (``agentgym check`` plays through it) has no pool: the default applies."""
    monkeypatch.setattr(_rollout, "CLOSE_TIMEOUT_S", 0.5)
    unblock, closed = _unblock_later(), []

    async def main() -> tuple[float, Any]:
        started = time.monotonic()
        trajectory = await run_episode(
            lambda: FailingEnvWithHungClose(unblock, closed),
            ScriptedPolicy(["a"]),
            EpisodeSpec(0, 0, 0, seed=0),
        )
        elapsed = time.monotonic() - started
        unblock.set()
        return elapsed, trajectory

    elapsed, trajectory = asyncio.run(main())
    assert elapsed < 10, elapsed
    assert trajectory.status == "error"
    assert "did not close within 0.5 s" in trajectory.info["close_error"]


def test_a_close_that_raises_is_still_recorded_on_its_episode() -> None:
    class FailingClose(FailingEnvWithHungClose):
        async def aclose(self) -> None:
            raise OSError("the server would not stop")

    async def main() -> list[Any]:
        pool = EnvPool(lambda: FailingClose(threading.Event(), []), close_timeout=5)
        return await arollout(pool, ScriptedPolicy(["a"]), tasks=[0])

    [trajectory] = asyncio.run(main())
    assert trajectory.status == "error"
    assert trajectory.info["close_error"].startswith("Traceback (most recent call last):")
    assert "OSError: the server would not stop" in trajectory.info["close_error"]


class WaitingEnvWithHungClose(FailingEnvWithHungClose):
    """Its reset says it began, then waits until cancelled; its close hangs as above."""

    def __init__(self, unblock: threading.Event, resetting: asyncio.Event) -> None:
        super().__init__(unblock, [])
        self.resetting = resetting

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        self.resetting.set()
        await asyncio.Event().wait()


def test_a_rollout_cancelled_midway_ends_within_the_close_deadline() -> None:
    """Ctrl-C or a trainer's shutdown cancels the playing episode; its env's close is bounded."""
    unblock = _unblock_later()

    async def main() -> float:
        resetting = asyncio.Event()
        pool = EnvPool(lambda: WaitingEnvWithHungClose(unblock, resetting), close_timeout=0.5)
        playing = asyncio.ensure_future(arollout(pool, ScriptedPolicy(["a"]), tasks=[0]))
        await resetting.wait()
        started = time.monotonic()
        playing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await playing
        elapsed = time.monotonic() - started
        unblock.set()
        return elapsed

    elapsed = asyncio.run(main())
    assert elapsed < 10, elapsed  # the cancel waited out the deadline, not the hung close

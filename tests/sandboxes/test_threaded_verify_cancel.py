"""A threaded reward's ``verify(sandbox=pool)`` gives its lease back soon after a cancel.

Why: a sync reward function runs on a worker thread (``Rubric(threaded=True)``), which a
cancelled episode abandons but cannot stop, so ``verify`` there held its pool lease until the
sandbox call ended on its own: ``total_timeout`` + slack, 35 s by default, while other
episodes waited for a sandbox. The rubric now kills the thread's sandbox call when it stops
waiting for it, and a cancelled ``verify`` has no outcome (never a pass, nor a failure).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from agentgym import Rubric
from agentgym.sandboxes import SandboxPool, VerifyResult, _reap, verify
from agentgym.sandboxes._client import docker_client
from tests.sandboxes.conftest import require_docker

pytestmark = pytest.mark.docker

#: Far under the 35 s (total_timeout 30 s + 5 s slack) the lease was held before; over the
#: 1.6 s it takes idle (the slow kill's 1 s included) with room for a saturated machine.
BOUND_S = 15.0
#: The candidate's program: it sleeps, as ``sleep 57.5`` (so the test can see it run).
SLEEPER = "import os\nos.execvp('sleep', ['sleep', '57.5'])\n"
#: How long the kill is made to take: a daemon that answers slowly (a remote host's can take
#: up to the client timeout), which on the event loop froze every episode that long.
SLOW_KILL_S = 1.0


async def _until(what: str, check: Callable[[], bool], timeout: float) -> None:
    """Wait until ``check()`` holds (looked at every 50 ms), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        await asyncio.sleep(0.05)


def _sleeping(client: Any, pool: SandboxPool) -> bool:
    """Whether the candidate's program sleeps in the pool's container now."""
    label = f"{_reap.POOL}={pool.pool_id}"
    return any("sleep 57.5" in " ".join(row)
               for container in client.containers.list(filters={"label": label})
               for row in container.top().get("Processes") or [])


async def _tick(ticks: list[float]) -> None:
    """Record in ``ticks`` when the loop ran this task, every 10 ms, until cancelled."""
    while True:
        ticks.append(time.monotonic())
        await asyncio.sleep(0.01)


async def test_a_cancelled_episodes_threaded_verify_returns_its_lease_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kill runs off the event loop: other episodes go on while it takes its time."""
    require_docker()
    protocol = sys.modules["agentgym.sandboxes._protocol"]
    begin = protocol.CallToken.begin

    def slow_begin(token: Any, kill: Callable[[], object]) -> None:
        def slow_kill() -> None:
            time.sleep(SLOW_KILL_S)  # a daemon slow to answer the kill's exec
            kill()

        begin(token, slow_kill)

    monkeypatch.setattr(protocol.CallToken, "begin", slow_begin)
    client = docker_client(timeout=30)
    outcomes: list[Any] = []
    finished = threading.Event()
    with SandboxPool(size=1) as pool:

        def judge(completion: str) -> float:
            try:
                outcomes.append(verify(SLEEPER, ["assert True"], sandbox=pool,
                                       per_test_timeout=60.0, total_timeout=30.0))
            except BaseException as exc:
                outcomes.append(exc)
                raise
            finally:
                finished.set()
            return 1.0

        episode = asyncio.ensure_future(Rubric([judge], threaded=True).score({"completion": ""}))
        await _until("the candidate's program runs", lambda: _sleeping(client, pool), 60)
        assert pool.idle == 0
        ticks: list[float] = []
        ticker = asyncio.ensure_future(_tick(ticks))
        await _until("the ticker runs", lambda: len(ticks) > 1, 10)
        cancelled = time.monotonic()
        episode.cancel()
        with pytest.raises(asyncio.CancelledError):
            await episode
        await _until("the lease is back in the pool", lambda: pool.idle == 1, BOUND_S)
        assert time.monotonic() - cancelled < BOUND_S
        ticker.cancel()
        gaps = [b - a for a, b in zip(ticks, ticks[1:]) if b >= cancelled]
        assert gaps and max(gaps) < SLOW_KILL_S / 2, max(gaps)  # the loop was never held
        assert await asyncio.to_thread(finished.wait, 30)
        assert not isinstance(outcomes[0], VerifyResult), outcomes  # no outcome, let alone a pass
        assert "cancel" in str(outcomes[0])
        # the next episode's verify, on the same pool, is judged on its own
        result = await asyncio.to_thread(verify, "def f():\n    return 1\n", ["assert f() == 1"],
                                         sandbox=pool)
        assert result.status == "passed", result


async def test_a_verify_cancelled_before_its_lease_takes_no_sandbox() -> None:
    """It waited up to the lease timeout, then took a sandbox ahead of live episodes."""
    require_docker()
    from agentgym import _rubric

    started, go, finished = threading.Event(), threading.Event(), threading.Event()
    outcomes: list[Any] = []
    with SandboxPool(size=1) as pool:

        def judge(completion: str) -> float:
            started.set()
            go.wait(30)  # the episode is cancelled while the judge does something else
            try:
                outcomes.append(verify("x = 1\n", ["assert x == 1"], sandbox=pool))
            except BaseException as exc:
                outcomes.append(exc)
            finally:
                finished.set()
            return 1.0

        with pool.lease():  # a live episode holds the only sandbox
            episode = asyncio.ensure_future(
                Rubric([judge], threaded=True).score({"completion": ""}))
            assert await asyncio.to_thread(started.wait, 30)
            episode.cancel()
            with pytest.raises(asyncio.CancelledError):
                await episode
            await asyncio.gather(*_rubric._kills)  # the call is marked cancelled
            go.set()
            assert await asyncio.to_thread(finished.wait, BOUND_S), "verify waited for a lease"
        assert "cancel" in str(outcomes[0]) and not isinstance(outcomes[0], VerifyResult)

"""Cancelling sandbox work at the awaits that hold (or wait for) a lease or a pool's start.

Each test parks the work at one await with a gate (a tool that waits on an event, a lease
that waits for the pool's only sandbox, a pool start held in its thread), cancels it there
(Ctrl-C, or twice), and checks what it held was let go: a later episode on the same
one-sandbox pool gets a sandbox and runs code in it, a cancelled pool start leaves no pool.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentgym import tool
from agentgym._env import _thread_loop
from agentgym.sandboxes import SandboxPool, SandboxToolEnv, close_shared_pools
from agentgym.sandboxes._env import _SLOTS
from agentgym.sandboxes._pool import POOL_LABEL
from tests.conftest import ctrl_c_when
from tests.sandboxes.conftest import own_containers

pytestmark = pytest.mark.docker

# A config no other test uses, so the one-sandbox pool is this module's alone.
CONFIG = {"default_timeout": 21.0}


@pytest.fixture(autouse=True, scope="module")
def _pools_closed_after() -> Iterator[None]:
    yield
    close_shared_pools()  # the env's shared pool lives on otherwise: its container too


def make_env(tools: list[Any] = ()) -> SandboxToolEnv:  # type: ignore[assignment]
    return SandboxToolEnv(list(tools), tasks=[{"prompt": "x"}], pool_size=1,
                          sandbox_config=CONFIG, lease_timeout=20)


def lease_waiters() -> int:
    """Episodes waiting for this module's pool (0 before it started)."""
    pool = next((s.pool for s in _SLOTS.values() if s.config.default_timeout == 21.0), None)
    return 0 if pool is None else len(pool._waiters)




def test_ctrl_c_in_a_sync_reset_waiting_for_a_lease_leaves_no_waiter_behind(docker_ready):
    """Old: the interrupted reset stayed pending on the env's loop and, resumed by the next
    sync call, took the sandbox the next episode waited for: that one got none in time."""
    holder = make_env()
    holder.reset()  # holds the pool's only sandbox
    waiting = make_env()
    parked = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 30  # a reset that never waits: `ctrl_c_when` gives up
        while not lease_waiters() and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        parked.set()

    threading.Thread(target=watch, daemon=True).start()
    with ctrl_c_when(parked, _thread_loop()), pytest.raises(KeyboardInterrupt):
        waiting.reset()
    assert lease_waiters() == 0  # the cancelled wait withdrew

    holder.close()
    later = make_env()
    later.reset()
    assert later.sandbox is not None and later.sandbox.run("print(6 * 7)").stdout == "42\n"
    later.close()
    waiting.close()


def test_ctrl_c_in_a_sync_step_leaves_nothing_running_and_closing_returns_the_sandbox(
        docker_ready):
    """A step interrupted in its sync tool is over when the interrupt is raised (old: it
    stayed pending on the env's loop, to resume in a later call); closing the env returns
    the sandbox to the pool."""
    entered, release = threading.Event(), threading.Event()

    @tool(timeout=None)
    def hold(sandbox: Any) -> str:
        """Run code until released."""
        entered.set()
        release.wait(30)
        return sandbox.run("print(1)").stdout

    env = make_env([hold])
    env.reset()
    with ctrl_c_when(entered, _thread_loop()), pytest.raises(KeyboardInterrupt):
        env.step('<tool_call>{"name": "hold", "arguments": {}}</tool_call>')
    assert not asyncio.all_tasks(_thread_loop())
    release.set()
    env.close()

    later = make_env()
    later.reset()
    assert later.sandbox is not None and later.sandbox.run("print(7)").stdout == "7\n"
    later.close()


async def test_a_pool_start_cancelled_twice_still_closes_the_pool(docker_ready):
    """Old: the second cancel (asyncio.run cancelling the tasks left, a trainer closing) ended
    the wait for the start at once, so the close after it never ran: the pool stayed open and
    its containers ran on."""
    pool = SandboxPool(size=1)
    loop = asyncio.get_running_loop()
    parked, go = asyncio.Event(), threading.Event()
    fill = pool._fill

    def parked_fill(*args: Any, **kwargs: Any) -> Any:  # connected; about to create containers
        loop.call_soon_threadsafe(parked.set)
        go.wait(60)
        return fill(*args, **kwargs)

    pool._fill = parked_fill  # type: ignore[method-assign]

    async def enter() -> None:
        async with pool:
            pytest.fail("the body ran")

    task = asyncio.create_task(enter())
    try:
        await parked.wait()
        task.cancel()
        await asyncio.sleep(0)  # the first cancel is handled: the task waits for the start
        task.cancel()
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.closed, "the pool was left running"
        assert [c for c in own_containers() if c.labels.get(POOL_LABEL) == pool.pool_id] == []
    finally:
        go.set()
        await asyncio.to_thread(pool.close)

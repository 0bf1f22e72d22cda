"""Cancellation at the awaits of the sandbox package that hold containers or a lease.

Each test parks the coroutine at one await (a hook in the worker thread tells the loop it got
there, then waits for the test to cancel), cancels it, and checks what it held was released.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentgym.sandboxes import DockerSandbox, SandboxPool
from agentgym.sandboxes._pool import POOL_LABEL
from tests.sandboxes.conftest import own_containers

pytestmark = pytest.mark.docker


class Gate:
    """Parks a worker thread until the test cancelled; tells the loop when it is parked."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.reached = asyncio.Event()
        self.go = threading.Event()

    def wrap(self, fn):
        def parked(*args, **kwargs):
            self.loop.call_soon_threadsafe(self.reached.set)
            self.go.wait(60)
            return fn(*args, **kwargs)

        return parked

    async def cancel(self, task: asyncio.Task) -> None:
        """Cancel ``task`` once the thread is parked, let the thread go on, await the task."""
        await self.reached.wait()
        task.cancel()
        self.go.set()
        with pytest.raises(asyncio.CancelledError):
            await task


def pool_containers(pool: SandboxPool) -> list:
    return [c for c in own_containers() if c.labels.get(POOL_LABEL) == pool.pool_id]


async def test_a_pool_start_cancelled_midway_closes_the_pool(docker_ready):
    # `async with SandboxPool()` cancelled while the start runs in its thread: __aexit__
    # never runs, so __aenter__ itself must close what the start goes on to create
    pool = SandboxPool(size=1)
    gate = Gate()
    pool._fill = gate.wrap(pool._fill)  # connected and reaped; about to create containers

    async def enter() -> None:
        async with pool:
            pytest.fail("the body ran")

    try:
        await gate.cancel(asyncio.create_task(enter()))
        assert pool.closed, "the pool was left running"
        assert pool_containers(pool) == []
    finally:
        await asyncio.to_thread(pool.close)


async def test_a_sandbox_start_cancelled_midway_removes_its_container(docker_ready):
    sandbox = DockerSandbox()
    gate = Gate()
    real_open, made = sandbox._open_server, []

    def open_server(*args, **kwargs):  # the container exists by now
        made.append(sandbox._container.id)
        return gate.wrap(real_open)(*args, **kwargs)

    sandbox._open_server = open_server

    async def enter() -> None:
        async with sandbox:
            pytest.fail("the body ran")

    try:
        await gate.cancel(asyncio.create_task(enter()))
        assert sandbox._container is None, "the container was left running"
        assert made and made[0] not in [c.id for c in own_containers()]
    finally:
        await asyncio.to_thread(sandbox.close)


async def test_a_lease_cancelled_while_restoring_its_snapshot_returns_the_sandbox(docker_ready):
    pool = await asyncio.to_thread(SandboxPool(size=1).start)
    try:
        async with pool.alease() as sb:
            await sb.arun("open('kept.txt', 'w').write('x')")
            snap = await asyncio.to_thread(sb.snapshot)
            sandbox = sb.sandbox
        gate = Gate()
        sandbox.restore = gate.wrap(sandbox.restore)  # the lease's own sandbox (size 1)

        async def episode() -> None:
            async with pool.alease(snapshot=snap):
                pytest.fail("the body ran")

        await gate.cancel(asyncio.create_task(episode()))
        [slot] = pool._slots
        assert slot.leased == 0, "the lease was not given back"
        async with pool.alease(timeout=60) as sb:  # the pool serves a working sandbox again
            assert (await sb.arun("print(1)")).stdout == "1\n"
    finally:
        await asyncio.to_thread(pool.close)
    assert pool_containers(pool) == []

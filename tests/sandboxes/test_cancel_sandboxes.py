"""Cancellation at the awaits of the sandbox package that hold containers or a lease.

Each test parks the coroutine at one await (a hook in the worker thread tells the loop it got
there, then waits for the test to cancel), cancels it, and checks what it held was released.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentgym import SandboxError
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


# --- a probe's findings: the first call's start, Ctrl-C, a container removed from outside ----


async def test_a_first_call_cancelled_while_its_container_starts_runs_no_code(docker_ready):
    """The kill found no container yet and was lost: the call went on to run its code to the
    end (``wait_for(arun(sleep 20), 0.05)`` returned after 20 s)."""
    sandbox = DockerSandbox()
    gate = Gate()
    sandbox._create_container = gate.wrap(sandbox._create_container)
    try:
        started = asyncio.get_running_loop().time()
        # a minute: at the default 10 s timeout a call that ran on ended inside the bound
        running_on = sandbox.arun("import time; time.sleep(60)", timeout=60)
        await gate.cancel(asyncio.create_task(running_on))
        # the container's start (0.5 s idle, seconds on a loaded machine), not the minute
        assert asyncio.get_running_loop().time() - started < 30
        after = await sandbox.arun("print('next')")  # the sandbox serves the next call
        assert (after.status.value, after.stdout) == ("ok", "next\n")
    finally:
        await asyncio.to_thread(sandbox.close)


async def test_close_while_the_first_call_starts_its_container_ends_that_call(docker_ready):
    """``close`` waited for the call, which then ran ``ok``; its outcome is infra_error now."""
    sandbox = DockerSandbox()
    gate = Gate()
    real_create, made = sandbox._create_container, []

    def create() -> None:
        gate.wrap(real_create)()
        made.append(sandbox.container_id)

    sandbox._create_container = create
    call = asyncio.create_task(sandbox.arun("import time; time.sleep(20); print('ran')"))
    await gate.reached.wait()
    closing = asyncio.create_task(asyncio.to_thread(sandbox.close))
    while not sandbox._closed:  # close() marked it and tried to kill the call: let it go on
        await asyncio.sleep(0)
    gate.go.set()
    result = await asyncio.wait_for(call, 60)
    await closing
    assert result.status.value == "infra_error" and "no code ran" in result.stderr
    assert made[0] is not None and made[0] not in [c.id for c in own_containers()]


async def test_close_while_a_reset_replaces_a_lost_container_keeps_the_sandbox_closed(
    docker_ready, docker_client
):
    """The replacement started its container through ``start()``, which reopens a closed
    sandbox: a ``close`` that came while the lost container was replaced was undone, and the
    next call started a container nobody removed before exit."""
    sandbox = DockerSandbox()
    sandbox.run("print('warm')")
    docker_client.api.kill(sandbox.container_id)  # lost: the reset must replace it
    gate = Gate()
    real_remove, made = sandbox._remove_container, []
    real_create = sandbox._create_container

    def remove() -> None:  # the replacement's removal parks; close()'s goes through
        real_remove()
        if not gate.go.is_set():
            gate.wrap(lambda: None)()

    def create() -> None:
        real_create()
        made.append(sandbox.container_id)

    sandbox._remove_container, sandbox._create_container = remove, create
    resetting = asyncio.create_task(asyncio.to_thread(sandbox.reset))
    await gate.reached.wait()  # the lost container removed, its replacement not started
    closing = asyncio.create_task(asyncio.to_thread(sandbox.close))
    while not sandbox._closed:  # close() marked it; it waits for the reset's lock
        await asyncio.sleep(0)
    gate.go.set()
    with pytest.raises(SandboxError, match="is closed"):
        await asyncio.wait_for(resetting, 60)
    await asyncio.wait_for(closing, 60)
    with pytest.raises(SandboxError, match="is closed"):
        await sandbox.arun("print('after close')")
    assert made == [] and sandbox.container_id is None  # no replacement was started


def test_ctrl_c_in_a_blocking_call_kills_its_code(docker_ready):
    """The interrupted code ran on in the container, and the next call waited for it (its
    timeout then blamed on that call's code)."""
    import time

    with DockerSandbox() as sandbox:
        sandbox.run("print('warm')")
        real_request = sandbox._channel.request

        def interrupted(*args, **kwargs):
            real_request({"op": "exec", "argv": ["sh", "-c", "sleep 30 &"], "timeout": 5,
                          "limit": 1000, "stdin": None, "files": {}}, 10)  # fmt: skip
            raise KeyboardInterrupt  # as Ctrl-C lands while the call waits for its reply

        sandbox._channel.request = interrupted
        with pytest.raises(KeyboardInterrupt):
            sandbox.run("print('never')")
        began = time.monotonic()
        after = sandbox.exec(["sh", "-c", "ps -eo comm | grep -c '^sleep$' || true"], timeout=5)
        assert after.status.value == "ok" and time.monotonic() - began < 5
        assert after.stdout.strip() == "0"  # the code of the interrupted call is gone


def test_a_container_removed_from_outside_mid_call_is_infrastructure(docker_ready, docker_client):
    """``docker rm -f`` during a call was scored as the code's ``error`` (verify: reward 0.0)
    when the container still read "running" while its removal ran."""
    with DockerSandbox() as sandbox:
        sandbox.run("print('warm')")
        container = sandbox.container_id
        remover = threading.Timer(1.0, lambda: docker_client.api.remove_container(
            container, force=True))  # fmt: skip
        remover.start()
        result = sandbox.run("import time; time.sleep(30)", timeout=40)
        remover.join()
        assert result.status.value == "infra_error", result
        assert sandbox.run("print(1)").stdout == "1\n"  # a new container serves the next call


def test_a_removed_container_that_still_reads_running_is_infrastructure(
    docker_ready, docker_client
):
    """The daemon reports a container ``docker rm -f`` killed as "running" until it has
    handled the exit: the recovery read "running" before and after its failed restart (seen
    once in ~37 loaded runs of the test above), replaced the container and scored the call as
    the code's ``error``. Here every read is the one taken before the removal, as a late
    daemon gives it; the removal, the failed restart and the replacement are Docker's own."""
    with DockerSandbox() as sandbox:
        sandbox.run("print('warm')")
        before = sandbox._container_running()
        assert before, "the container runs before its removal"
        sandbox._container_running = lambda: before  # the daemon's answer, late
        sandbox._killed_by_docker = lambda: False  # its event log unread: the removal decides
        docker_client.api.remove_container(sandbox.container_id, force=True)
        result = sandbox.run("print('never')")
        del sandbox._container_running, sandbox._killed_by_docker
        assert result.status.value == "infra_error", result
        assert 'read "running" but was being removed' in result.infra_error, result
        assert sandbox.run("print(1)").stdout == "1\n"  # a new container serves the next call


def test_a_docker_kill_read_late_is_infrastructure_though_our_removal_came_first(
    docker_ready, docker_client
):
    """A plain ``docker kill`` from outside, read "running" by both reads, and removed by the
    replacement before the daemon's own auto-removal: nothing said "not the code", and the
    call was the code's ``error``. The daemon's log of the kill says it now. The kill and the
    removal are Docker's; only the two reads (as a late daemon gives them) and the removal's
    "it was still there" answer (our removal first: a race real Docker will not hold still
    for) are pinned."""
    with DockerSandbox() as sandbox:
        sandbox.run("print('warm')")
        before = sandbox._container_running()
        assert before, "the container runs before the kill"
        remove = sandbox._remove_container
        sandbox._container_running = lambda: before  # the daemon's answer, late
        sandbox._remove_container = lambda: remove() and False  # removed by us, not before
        docker_client.api.kill(sandbox.container_id)
        result = sandbox.run("print('never')")
        del sandbox._container_running, sandbox._remove_container
        assert result.status.value == "infra_error", result
        assert "Docker had killed it" in result.infra_error, result
        assert sandbox.run("print(1)").stdout == "1\n"  # a new container serves the next call


def test_a_file_larger_than_the_sandbox_takes_is_refused_before_it_is_sent(docker_ready):
    """100 MiB of ``files`` took the code server's memory: the call came back as the code's
    failure ("killed by the code?") and the Python session was lost, with no code run."""
    with DockerSandbox() as sandbox:
        sandbox.run("x = 42")
        big = sandbox.run("print('ran')", files={"data.bin": b"\0" * (65 << 20)})
        assert big.status.value == "error"
        assert "'data.bin' is 65.0 MiB, over the sandbox's largest file (fsize_mb=64)" in big.stderr
        assert sandbox.run("print(x)").stdout == "42\n"  # the session lives on


def test_a_failed_container_start_neither_closes_the_sandbox_nor_leaks_it(
    docker_ready, monkeypatch
):
    """One passing daemon failure (its start and remove both failing, as a restarting daemon
    did) closed the sandbox for good, and the created container outlived close() and exit."""
    import docker.models.containers as containers

    def daemon_away(*args, **kwargs):
        raise RuntimeError("simulated: daemon shutting down")

    sandbox = DockerSandbox()
    try:
        with monkeypatch.context() as away:
            away.setattr(containers.Container, "start", daemon_away)
            away.setattr(containers.Container, "remove", daemon_away)
            failed = sandbox.run("print(1)")
            assert failed.status.value == "infra_error" and "shutting down" in failed.stderr
            left = sandbox.left_behind
            assert left is not None and left in [c.id for c in own_containers()]
        assert sandbox.run("print(2)").stdout == "2\n"  # not closed: the next call runs
        assert left not in [c.id for c in own_containers()]  # removed once the daemon answers
    finally:
        sandbox.close()


def test_ctrl_c_in_a_pool_start_removes_what_it_made(docker_ready):
    """A notebook's Ctrl-C left a half-started pool: containers running, none idle, every
    lease waiting forever."""
    pool = SandboxPool(size=1)
    real_fill = pool._fill

    def interrupted(slots):
        real_fill(slots)
        raise KeyboardInterrupt

    pool._fill = interrupted
    with pytest.raises(KeyboardInterrupt):
        pool.start()
    assert pool.closed and pool_containers(pool) == []


def test_close_during_a_pool_start_is_one_sandbox_error(docker_ready):
    """It was ``RuntimeError: cannot schedule new futures after shutdown``, or a started pool
    that was already closed."""
    pool = SandboxPool(size=1)
    real_fill = pool._fill

    def closed_first(slots):
        pool.close()
        return real_fill(slots)

    pool._fill = closed_first
    with pytest.raises(SandboxError, match="closed while it started; create a new SandboxPool"):
        pool.start()
    assert pool_containers(pool) == []

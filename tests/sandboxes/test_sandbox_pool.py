"""SandboxPool: leases, reset between leases, recycling, bounded creation, reaping."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from agentgym._errors import SandboxError
from agentgym.sandboxes import DockerSandbox, SandboxPool, _reap
from tests.sandboxes.conftest import (
    BLOCKING_CELL,
    MAKE_FIFO,
    alive,
    own_containers,
    wait_until_code_runs,
)

pytestmark = pytest.mark.docker


def test_lease_keeps_files_and_session_then_resets(pool):
    with pool.lease() as sb:
        sb.run("counter = 1\nopen('notes.txt', 'w').write('turn 1')")
        sb.run("counter += 1")
        assert sb.run("print(counter, open('notes.txt').read())").stdout == "2 turn 1\n"
    for _ in range(pool.size):  # whichever sandbox comes next, it is clean
        with pool.lease() as sb:
            assert sb.exec(["ls", "-A"]).stdout == ""
            assert "NameError" in sb.run("counter").stderr


async def test_async_leases_run_in_parallel(pool):
    held: list[tuple[float, float]] = []  # each lease's (start, end), not a wall-clock bound

    async def episode(i: int) -> str:
        async with pool.alease() as sb:
            start = time.perf_counter()
            await sb.arun(f"x = {i}")
            await sb.arun("import time; time.sleep(0.3)")
            out = (await sb.arun("print(x)")).stdout
            held.append((start, time.perf_counter()))
            return out

    outs = await asyncio.gather(*(episode(i) for i in range(6)))
    assert outs == [f"{i}\n" for i in range(6)]
    most_at_once = max(sum(s <= t < e for s, e in held) for t, _ in held)
    assert most_at_once >= 2, f"leases must overlap: {held}"


async def test_cancelled_waiter_does_not_leak_a_sandbox(pool):
    async with pool.alease() as a, pool.alease() as b, pool.alease() as c:
        assert pool.idle == 0
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(pool._acquire_async(None), 0.2)
        del a, b, c
    # returned sandboxes are reset on worker threads: rather than poll `idle`, lease every
    # sandbox at once again, which only works if none went to the cancelled waiter
    async with contextlib.AsyncExitStack() as stack:
        again = [await stack.enter_async_context(pool.alease(timeout=30))
                 for _ in range(pool.size)]
        assert len({sb.container_id for sb in again}) == pool.size and pool.idle == 0


async def test_a_lease_cancelled_right_after_the_hand_off_returns_the_sandbox(docker_ready):
    pool = await asyncio.to_thread(SandboxPool(size=1).start)
    try:
        loop = asyncio.get_running_loop()
        handed = []
        async with pool.alease():
            waiting = asyncio.create_task(pool._acquire_async(None))
            await asyncio.sleep(0)  # one loop turn: the task queues itself as a waiter
            assert len(pool._waiters) == 1
            real_hand = pool._hand

            def hand_then_cancel(waiter, item):
                # on the loop: queue the hand-off, then the cancel right behind it, so the
                # task is cancelled after its future got the sandbox, before it resumes
                def in_loop():
                    handed.append(waiter)
                    real_hand(waiter, item)
                    loop.call_soon(waiting.cancel)
                loop.call_soon_threadsafe(in_loop)

            pool._hand = hand_then_cancel
        with pytest.raises(asyncio.CancelledError):
            await waiting
        del pool._hand
        [waiter] = handed
        assert waiter.future.done() and not waiter.future.cancelled(), "not at the hand-off"
        async with pool.alease(timeout=30) as sb:  # the sandbox came back to the pool
            assert (await sb.arun("print(1)")).stdout == "1\n"
    finally:
        await asyncio.to_thread(pool.close)


async def test_lease_timeout_is_a_sandbox_error_sync_and_async(pool):
    async with pool.alease(), pool.alease(), pool.alease():
        with pytest.raises(SandboxError, match="no sandbox free"):
            with pool.lease(timeout=0.2):
                pass
        with pytest.raises(SandboxError, match="no sandbox free"):
            async with pool.alease(timeout=0.2):
                pass


def test_a_lease_ends_only_after_its_running_call_was_killed(docker_ready):
    with SandboxPool(size=1) as pool:
        returned, results = [], []
        real_release = pool._release

        def release(sandbox, failed):  # what the pool gets back, and when
            returned.append(alive(sandbox, pid))
            real_release(sandbox, failed)

        pool._release = release
        with pool.lease() as sb:
            assert sb.run(MAKE_FIFO).ok
            # timeout 60 s: a lease that waited for the call would take a minute, not the
            # default 10 s that a bound with room for a loaded machine could not tell apart
            call = threading.Thread(
                target=lambda: results.append(sb.run(BLOCKING_CELL, timeout=60)))
            call.start()
            pid = wait_until_code_runs(sb)
            started = time.monotonic()
        ended_after = time.monotonic() - started
        call.join()
        assert returned == [False], "the sandbox went back while the code still ran"
        assert ended_after < 20, f"the lease took {ended_after:.1f}s to end"  # 0.3 s idle
        assert results[0].status == "error" and not results[0].infra_error, results[0]
        with pytest.raises(SandboxError, match="lease has ended"):
            sb.run("print(1)")
        with pool.lease(timeout=60) as again:
            assert again.run("print(1)").stdout == "1\n"


def test_recycle_after_max_uses_and_after_failure(docker_ready):
    with SandboxPool(size=1, max_uses=2) as pool:
        ids = []
        for _ in range(3):
            with pool.lease() as sb:
                ids.append(sb.container_id)
        assert ids[0] == ids[1] != ids[2]
        with pytest.raises(RuntimeError):
            with pool.lease() as sb:
                raise RuntimeError("episode crashed")
        with pool.lease() as sb2:
            assert sb2.container_id != ids[2]
            assert sb2.run("print(1)").stdout == "1\n"
        assert pool.stats.recycled == 2 and pool.stats.created == 3


def test_creation_concurrency_is_bounded(docker_ready, monkeypatch):
    in_flight, peak, lock = 0, 0, threading.Lock()
    real_start = DockerSandbox.start

    def counting_start(self):
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        try:
            return real_start(self)
        finally:
            with lock:
                in_flight -= 1

    monkeypatch.setattr(DockerSandbox, "start", counting_start)
    with SandboxPool(size=4, max_concurrent_creates=2) as pool:
        assert pool.idle == 4
    assert peak == 2


def test_a_failing_reset_replaces_the_sandbox(docker_ready, monkeypatch):
    def broken_reset(self, hard=False):
        raise SandboxError("daemon hiccup")

    with SandboxPool(size=1) as pool:
        with pool.lease() as sb:
            first = sb.container_id
        monkeypatch.setattr(DockerSandbox, "reset", broken_reset)
        with pool.lease(timeout=30) as sb:  # the failed reset must not lose the slot
            assert sb.container_id != first and sb.run("print(1)").stdout == "1\n"
        assert pool.stats.recycled >= 1


def test_reaps_containers_of_a_process_killed_with_sigkill(docker_client):
    """A container whose lifeline did not end it (one made without it, as before the lifeline,
    or whose stop failed) is reaped once its owner is dead."""
    code = ("from agentgym.sandboxes import DEFAULT_IMAGE, _reap\n"
            "from agentgym.sandboxes._client import docker_client\n"
            "c = docker_client().containers.run(DEFAULT_IMAGE, ['sleep', 'infinity'],\n"
            "    detach=True, network_mode='none', labels=_reap.ownership_labels())\n"
            "print(c.id, flush=True)\n"
            "import time; time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        leaked_id = child.stdout.readline().strip()
        assert leaked_id
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
    client = docker_client
    leaked = client.containers.get(leaked_id)
    assert not _reap.owner_alive(leaked.labels)
    with SandboxPool(size=1) as pool:
        assert pool.stats.reap_removed >= 1
    remaining = [c.id for c in _reap.managed_containers(client)]
    assert leaked_id not in remaining


def test_live_owners_are_not_reaped(pool, docker_client):
    client = docker_client
    assert _reap.reap_leaked(client) == []
    with pool.lease() as sb:
        assert sb.run("print(1)").ok


def test_a_container_removed_while_the_reaper_lists_them_is_skipped(docker_client, monkeypatch):
    """Two processes reaping at once: one removed a container between the other's list and
    its inspect of it, and docker-py's NotFound failed the second pool's start."""
    from docker.models.containers import ContainerCollection

    from agentgym.sandboxes import DEFAULT_IMAGE

    doomed = docker_client.containers.create(
        DEFAULT_IMAGE, command="true", labels=_reap.ownership_labels(lifetime_s=3600)
    )
    real_get = ContainerCollection.get

    def removed_first(self, container_id, *args, **kwargs):  # the other reaper wins the race
        if container_id == doomed.id:
            doomed.remove(force=True)
        return real_get(self, container_id, *args, **kwargs)

    monkeypatch.setattr(ContainerCollection, "get", removed_first)
    listed = _reap.managed_containers(docker_client)
    assert doomed.id not in {c.id for c in listed}
    assert _reap.reap_leaked(docker_client) == []


def test_pool_close_removes_its_containers(docker_client):
    pool = SandboxPool(size=2).start()
    with pool.lease() as sb:
        sb.run("print(1)")
    pool.close()
    labels = {c.labels.get("agentgym.pool") for c in _reap.managed_containers(docker_client)}
    assert pool.pool_id not in labels
    with pytest.raises(SandboxError, match="not running"):
        with pool.lease():
            pass


def test_failed_creation_reaches_the_waiter_then_the_pool_refills(docker_ready):
    with SandboxPool(size=1, max_uses=1) as pool:
        good_image = pool.image
        pool.image = "agentgym-sandbox:does-not-exist"  # the replacement will fail
        with pool.lease():
            pass
        with pytest.raises(SandboxError, match="not found"):
            with pool.lease(timeout=30):
                pass
        pool.image = good_image
        with pool.lease(timeout=30) as sb:  # a waiter triggers a new creation
            assert sb.run("print(1)").stdout == "1\n"
        assert pool.stats.create_failures == 1


def test_concurrent_starts_create_the_pool_once(docker_ready):
    # episodes that share a pool all call start(); only the first may create containers
    pool = SandboxPool(size=2)
    try:
        threads = [threading.Thread(target=pool.start) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        mine = [c for c in own_containers() if c.labels.get(_reap.POOL) == pool.pool_id]
        assert len(mine) == 2 and pool.stats.created == 2 and pool.idle == 2
    finally:
        pool.close()

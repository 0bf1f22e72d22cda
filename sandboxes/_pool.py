"""`SandboxPool`: warm Docker sandboxes leased one episode at a time.

One implementation for both worlds: the pool's state is guarded by a lock, blocking work
(create, reset, recycle) runs on the pool's own worker threads, and a waiting lease is handed
the next free sandbox directly, through a ``threading.Event`` (sync) or an ``asyncio`` future
set with ``call_soon_threadsafe`` (async), so async waiters never hold a thread. A waiter that
gives up (timeout, cancellation) after the hand-off passes the sandbox on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentgym._errors import ConfigError, SandboxError

from . import _reap
from ._client import docker_client
from ._config import DEFAULT_IMAGE, DockerSandboxConfig
from ._docker import DockerSandbox, Snapshot
from ._lease import SandboxLease

POOL_LABEL = _reap.POOL
log = logging.getLogger("agentgym.sandboxes")


@dataclass
class PoolStats:
    """Counters of one pool (log them under ``sandbox/``)."""

    created: int = 0  # containers started, replacements included
    recycled: int = 0  # containers replaced after max_uses or a failure
    leases: int = 0  # leases handed out
    reap_removed: int = 0  # leaked containers of dead owners removed at start
    create_failures: int = 0  # container creations that failed


class _Waiter:
    """One pending lease: sync (``event``) or async (``loop`` + ``future``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.future: asyncio.Future[Any] | None = loop.create_future() if loop else None
        self.event = threading.Event()
        self.item: Any = None


class SandboxPool:
    """Warm, hardened sandboxes; one lease per episode.

    Example::

        async with SandboxPool(size=4) as pool:
            async with pool.alease() as sb:         # files + Python session live for the lease
                await sb.arun("x = 1")
                print((await sb.arun("print(x)")).stdout)

        with SandboxPool(size=2) as pool, pool.lease() as sb:
            sb.run("print(1)")

    A lease is a `SandboxLease`: when it ends, calls still running are killed and awaited
    before the sandbox returns, and later calls through it raise `SandboxError`.

    Between leases a sandbox is reset (every code process killed, work dir and /tmp emptied,
    new Python session). It is replaced by a fresh container after ``max_uses`` leases, after
    any host-side intervention or backend failure (`DockerSandbox.needs_recycle`), and when
    the lease's body raised. At most ``max_concurrent_creates`` containers are created at once
    (the daemon slows sharply under concurrent creates). Leaked agentgym containers whose owner
    process is gone (even one killed with -9) are removed at `start`; this pool's own
    containers are removed at `close` and at interpreter exit.
    """

    def __init__(self, size: int = 4, image: str = DEFAULT_IMAGE,
                 config: DockerSandboxConfig | None = None, *, max_concurrent_creates: int = 2,
                 max_uses: int = 100, client: Any = None) -> None:
        if size < 1 or max_concurrent_creates < 1 or max_uses < 1:
            raise ConfigError(f"size, max_concurrent_creates and max_uses must be >= 1, got "
                              f"{size}, {max_concurrent_creates}, {max_uses}")
        self.size, self.image, self.max_uses = size, image, max_uses
        self.config = config or DockerSandboxConfig()
        self.stats = PoolStats()
        self.pool_id = uuid.uuid4().hex[:12]
        self._client = client
        self._owns_client = client is None
        self._create_sem = threading.Semaphore(max_concurrent_creates)
        self._lock = threading.Lock()
        self._idle: deque[DockerSandbox] = deque()
        self._waiters: deque[_Waiter] = deque()
        self._all: set[DockerSandbox] = set()
        self._uses: dict[DockerSandbox, int] = {}  # leases returned, per live sandbox
        self._creating = 0  # creations in flight (initial ones, replacements and refills)
        self._workers = ThreadPoolExecutor(max_workers=min(size, 16) + max_concurrent_creates,
                                           thread_name_prefix="agentgym-pool")
        self._started = self._closed = False
        self._start_lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> SandboxPool:
        """Reap leaked containers, then create ``size`` warm sandboxes (bounded concurrency).

        Safe to call from many threads at once (episodes sharing a pool all call it): the
        first caller starts the pool, the others wait for it and return.
        """
        with self._start_lock:
            return self._start_once()

    def _start_once(self) -> SandboxPool:
        if self._started:
            return self
        if self._closed:
            raise SandboxError("this sandbox pool was closed; create a new SandboxPool")
        if self._client is None:
            self._client = docker_client()
        self.stats.reap_removed = len(_reap.reap_leaked(self._client))
        with self._lock:  # counted, so a lease made meanwhile does not create extra ones
            self._started = True
            self._creating += self.size
        futures = [self._workers.submit(self._create) for _ in range(self.size)]
        errors = [f.exception() for f in futures if f.exception() is not None]
        for f in futures:
            if f.exception() is None:
                self._deliver(f.result())
        if errors:
            self.close()
            raise SandboxError(f"{len(errors)} of {self.size} sandboxes failed to start: "
                               f"{errors[0]}") from errors[0]
        return self

    def close(self) -> None:
        """Remove every container of the pool; leases still out are closed on return."""
        with self._lock:
            self._closed = True
            self._idle.clear()
            waiters, self._waiters = list(self._waiters), deque()
        for waiter in waiters:
            self._hand(waiter, SandboxError("the sandbox pool was closed"))
        self._workers.shutdown(wait=True, cancel_futures=True)  # in-flight resets/creates end
        with self._lock:
            everything, self._all = list(self._all), set()
        for sandbox in everything:
            sandbox.close()
        if self._owns_client and self._client is not None:
            self._client.close()  # its HTTP connections to the daemon
            self._client = None

    def __enter__(self) -> SandboxPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> SandboxPool:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    @property
    def idle(self) -> int:
        """Sandboxes ready to lease right now."""
        return len(self._idle)

    @property
    def closed(self) -> bool:
        """True once `close` ran (a failed `start` closes the pool too)."""
        return self._closed

    # -- leasing ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def lease(self, snapshot: Snapshot | None = None,
              timeout: float | None = None) -> Iterator[SandboxLease]:
        """Lease a sandbox for one episode; optionally restore ``snapshot`` first.

        Waits up to ``timeout`` seconds (None: forever) for a free sandbox, then raises
        `SandboxError`. The body raising replaces the sandbox instead of resetting it.
        """
        sandbox = self._acquire_sync(timeout)
        lease = self._lease(sandbox)
        ok = False
        try:
            if snapshot is not None:
                sandbox.restore(snapshot)
            yield lease
            ok = True
        finally:
            lease.end(failed=not ok)

    @contextlib.asynccontextmanager
    async def alease(self, snapshot: Snapshot | None = None,
                     timeout: float | None = None) -> AsyncIterator[SandboxLease]:
        """Async twin of `lease`; waiting holds no thread, and cancelling it loses nothing."""
        sandbox = await self._acquire_async(timeout)
        lease = self._lease(sandbox)
        ok = False
        try:
            if snapshot is not None:
                await asyncio.to_thread(sandbox.restore, snapshot)
            yield lease
            ok = True
        finally:
            await lease.aend(failed=not ok)

    def _lease(self, sandbox: DockerSandbox) -> SandboxLease:
        return SandboxLease(sandbox, lambda failed: self._release(sandbox, failed))

    def _take_or_wait(self, waiter: _Waiter) -> DockerSandbox | None:
        with self._lock:
            if self._closed or not self._started:
                raise SandboxError("the sandbox pool is not running (use `with pool:` or "
                                   "pool.start())")
            if self._idle:
                self.stats.leases += 1
                return self._idle.popleft()
            self._waiters.append(waiter)
            refill = len(self._all) + self._creating < self.size
            if refill:  # an earlier creation failed: try again for this waiter
                self._creating += 1
        if refill:
            self._workers.submit(self._refill)
        return None

    def _refill(self) -> None:
        """Create one sandbox (already counted in ``_creating``) and deliver it or the error."""
        try:
            sandbox = self._create()
        except Exception as exc:
            self._deliver(exc)
            return
        self._deliver(sandbox)

    def _acquire_sync(self, timeout: float | None) -> DockerSandbox:
        waiter = _Waiter()
        sandbox = self._take_or_wait(waiter)
        if sandbox is not None:
            return sandbox
        if not waiter.event.wait(timeout):
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                    raise self._no_sandbox(timeout)
            waiter.event.wait()
        return self._unwrap(waiter.item)

    async def _acquire_async(self, timeout: float | None) -> DockerSandbox:
        waiter = _Waiter(asyncio.get_running_loop())
        sandbox = self._take_or_wait(waiter)
        if sandbox is not None:
            return sandbox
        assert waiter.future is not None
        try:
            async with asyncio.timeout(timeout):
                item = await waiter.future
        except TimeoutError:
            self._withdraw(waiter)
            raise self._no_sandbox(timeout) from None
        except BaseException:  # cancelled
            self._withdraw(waiter)
            raise
        return self._unwrap(item)

    def _no_sandbox(self, timeout: float | None) -> SandboxError:
        return SandboxError(f"no sandbox free within {timeout}s (pool size {self.size})")

    def _withdraw(self, waiter: _Waiter) -> None:
        """Take a waiter that gave up out of the queue, or pass on what it was handed.

        Why: the hand-off and the give-up race. If the sandbox was already put in the
        waiter's future, nobody else will ever lease it unless it goes back here.
        """
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                return
        future = waiter.future
        if future is not None and future.done() and not future.cancelled():
            item = future.result()
            if isinstance(item, DockerSandbox):
                self._deliver(item)

    def _unwrap(self, item: Any) -> DockerSandbox:
        if isinstance(item, BaseException):
            raise SandboxError(f"sandbox creation failed: {item}") from item
        with self._lock:
            self.stats.leases += 1
        return item

    # -- returning, recycling ---------------------------------------------------------------
    def _release(self, sandbox: DockerSandbox, failed: bool) -> None:
        with self._lock:
            closed = self._closed
            self._uses[sandbox] = uses = self._uses.get(sandbox, 0) + 1
        if not closed:
            try:
                self._workers.submit(self._recycle, sandbox, failed or uses >= self.max_uses)
                return
            except RuntimeError:  # close() shut the workers down meanwhile
                pass
        sandbox.close()

    def _recycle(self, sandbox: DockerSandbox, replace: bool) -> None:
        """Reset ``sandbox`` and deliver it, or replace it with a fresh one."""
        if not (replace or sandbox.needs_recycle):
            try:
                sandbox.reset()
            except Exception as exc:  # the daemon failed even the replacement: drop it
                log.warning("reset of a pooled sandbox failed, replacing it: %s", exc)
                replace = True
        if replace or sandbox.needs_recycle:
            with self._lock:
                self._creating += 1
                self._all.discard(sandbox)
                self._uses.pop(sandbox, None)
                self.stats.recycled += 1
            sandbox.close()
            self._refill()
            return
        self._deliver(sandbox)

    def _create(self) -> DockerSandbox:
        """Start one sandbox; the caller added it to ``_creating`` beforehand."""
        try:
            with self._create_sem:
                sandbox = DockerSandbox(self.image, self.config, client=self._client,
                                        labels={POOL_LABEL: self.pool_id})
                try:
                    sandbox.start()
                except Exception:
                    with self._lock:
                        self.stats.create_failures += 1
                    sandbox.close()
                    raise
            with self._lock:
                self._all.add(sandbox)
                self.stats.created += 1
        finally:
            with self._lock:
                self._creating -= 1
        return sandbox

    def _deliver(self, item: DockerSandbox | BaseException) -> None:
        """Hand ``item`` to the oldest waiter, or park a sandbox as idle."""
        with self._lock:
            if self._closed:
                waiter = None
            elif self._waiters:
                waiter = self._waiters.popleft()
            else:
                if isinstance(item, DockerSandbox):
                    self._idle.append(item)
                return
        if waiter is None:
            if isinstance(item, DockerSandbox):
                item.close()
            return
        self._hand(waiter, item)

    def _hand(self, waiter: _Waiter, item: Any) -> None:
        if waiter.loop is None:
            waiter.item = item
            waiter.event.set()
            return

        def settle() -> None:
            assert waiter.future is not None
            if waiter.future.done():  # cancelled or timed out meanwhile: pass it on
                if isinstance(item, DockerSandbox):
                    self._deliver(item)
            else:
                waiter.future.set_result(item)

        try:
            waiter.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the waiter's loop is closed
            if isinstance(item, DockerSandbox):
                self._deliver(item)

"""`SandboxPool`: warm Docker sandboxes leased one episode at a time.

One implementation for both worlds: the pool's state is guarded by a lock, blocking work
(create, reset, recycle) runs on the pool's own worker threads, and a waiting lease is handed
the next free sandbox directly, through a ``threading.Event`` (sync) or an ``asyncio`` future
set with ``call_soon_threadsafe`` (async), so async waiters never hold a thread. A waiter that
gives up (timeout, cancellation) after the hand-off passes the sandbox on.

Several Docker hosts: each host keeps its own warm share (``HostSlot``: idle sandboxes,
creations in flight, caps). A lease takes a free sandbox from the up host with the fewest
leases out; a sandbox coming back goes to the oldest waiter, whatever its host. A host whose
creation fails or that misses a health check is down for a cool-off: its idle sandboxes are
dropped and nothing is created or leased there; the health check after the cool-off brings
it back and refills it. A one-host pool never marks its host down: as before, a lease that
finds the pool short starts a creation, so it heals when the daemon does; with every host of
several down, a lease does the same on the host whose cool-off ends first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentgym._errors import ConfigError, SandboxError

from . import _reap
from ._config import DEFAULT_IMAGE, DockerSandboxConfig, check_image, docker_config
from ._docker import DockerSandbox, Snapshot
from ._host_slot import HostSlot, HostStats
from ._hosts import DockerHost
from ._lease import SandboxLease
from ._protocol import in_thread_to_the_end

POOL_LABEL = _reap.POOL
log = logging.getLogger("agentgym.sandboxes")


@dataclass
class PoolStats:
    """Counters of one pool (log them under ``sandbox/``); ``hosts`` splits them per host."""

    created: int = 0  # containers started, replacements included
    recycled: int = 0  # containers replaced after max_uses or a failure
    leases: int = 0  # leases handed out
    reap_removed: int = 0  # leaked containers (dead owner, or expired) removed at start
    create_failures: int = 0  # container creations that failed
    hosts: dict[str, HostStats] = field(default_factory=dict)  # by `DockerHost.name`


class _Waiter:
    """One pending lease: sync (``event``) or async (``loop`` + ``future``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.future: asyncio.Future[Any] | None = loop.create_future() if loop else None
        self.event = threading.Event()
        self.item: Any = None


class SandboxPool:
    """Warm, hardened sandboxes; one lease per episode; on one Docker host or several.

    Example::

        async with SandboxPool(size=4) as pool:
            async with pool.alease() as sb:         # files + Python session live for the lease
                await sb.arun("x = 1")
                print((await sb.arun("print(x)")).stdout)

        with SandboxPool(size=2) as pool, pool.lease() as sb:
            sb.run("print(1)")

        hosts = [DockerHost(), DockerHost.from_cert_dir("tcp://10.0.0.5:2376", "certs/gpu-1")]
        with SandboxPool(size=8, hosts=hosts, max_creates_per_second=5) as pool: ...

    A lease is a `SandboxLease`: when it ends, calls still running are killed and awaited
    before the sandbox returns, and later calls through it raise `SandboxError`.

    Between leases a sandbox is reset (every code process killed, work dir and /tmp emptied,
    new Python session). It is replaced by a fresh container after ``max_uses`` leases, after
    any host-side intervention or backend failure (`DockerSandbox.needs_recycle`), when the
    lease's body raised, and when it nears its expiry (``config.max_lifetime_s``). Leaked
    agentgym containers (owner process gone, even one killed with -9, or past their expiry)
    are removed at `start` on every host; this pool's own containers are removed at `close`
    and at interpreter exit.

    ``hosts`` (default: the environment's daemon, as before) each keep a warm share of
    ``size`` (split evenly, the first hosts taking the remainder). Caps, both per host since
    each daemon is its own bottleneck: at most ``max_concurrent_creates`` sandboxes starting
    at once (the daemon slows sharply under concurrent creates) and, if set, at most
    ``max_creates_per_second`` container creates per second (bursts of up to one second's
    worth). With several hosts, every ``health_interval_s`` each host is pinged; a host that
    fails a ping or a creation is routed around for ``host_cooloff_s`` and refilled when it
    answers again. Calls of a lease on a host that died return ``infra_error`` results, and
    the lease ends without waiting on that host.
    """

    def __init__(self, size: int = 4, image: str = DEFAULT_IMAGE,
                 config: DockerSandboxConfig | None = None, *, max_concurrent_creates: int = 2,
                 max_uses: int = 100, client: Any = None,
                 hosts: Sequence[DockerHost | str] | None = None,
                 max_creates_per_second: float | None = None, host_cooloff_s: float = 30.0,
                 health_interval_s: float = 5.0) -> None:
        for name, value in (("size", size), ("max_concurrent_creates", max_concurrent_creates),
                            ("max_uses", max_uses)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be a whole number, got {value!r}")
            if value < 1:  # name the one that is wrong, and what it means
                raise ConfigError(f"{name} must be >= 1 ({_WHOLE_MEANS[name]}), got {value}")
        # Why: a YAML string raised a bare TypeError here, and nan passed every `<= 0` test.
        if max_creates_per_second is not None:
            _positive_seconds("max_creates_per_second", max_creates_per_second,
                              "container creates per second per host, or None for no cap",
                              allow_inf=True)
        _positive_seconds("host_cooloff_s", host_cooloff_s, "seconds a failed host rests")
        _positive_seconds("health_interval_s", health_interval_s,
                          "seconds between health checks")
        image = check_image(image)
        targets = _check_hosts(hosts, client, size)
        self.size, self.image, self.max_uses = size, image, max_uses
        self.config = docker_config(config)
        self.host_cooloff_s, self.health_interval_s = host_cooloff_s, health_interval_s
        self.pool_id = uuid.uuid4().hex[:12]
        n = len(targets)
        self._slots = [HostSlot(host, size // n + (i < size % n), max_concurrent_creates,
                                 max_creates_per_second, client)
                       for i, host in enumerate(targets)]
        self.stats = PoolStats(hosts={slot.host.name: slot.stats for slot in self._slots})
        self._routing = n > 1  # with one host there is nowhere to route to: never "down"
        self._lock = threading.Lock()
        self._waiters: deque[_Waiter] = deque()
        self._host_of: dict[DockerSandbox, HostSlot] = {}  # every live sandbox's host
        self._uses: dict[DockerSandbox, int] = {}  # leases returned, per live sandbox
        self._workers = ThreadPoolExecutor(
            max_workers=min(size, 16) + max_concurrent_creates * n,
            thread_name_prefix="agentgym-pool")
        self._closing = threading.Event()  # wakes the health checks and paced creations
        self._monitor: threading.Thread | None = None
        self._started = self._closed = False
        self._start_lock = threading.Lock()

    @property
    def hosts(self) -> list[DockerHost]:
        """The pool's hosts, in the order given."""
        return [slot.host for slot in self._slots]

    @property
    def _client(self) -> Any:
        """The first host's container client (the only one by default; `_bench` uses it)."""
        return self._slots[0].client

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> SandboxPool:
        """Reap leaked containers and create the warm sandboxes, on every host.

        Safe to call from many threads at once (episodes sharing a pool all call it): the
        first caller starts the pool, the others wait for it and return. Raises
        `SandboxError` when no host started cleanly; a host that failed while another
        succeeded starts down (routed around) and joins when it answers a health check.
        """
        with self._start_lock:
            if self._closed:  # before `_started`: a closed pool once started, and stays closed
                raise SandboxError("this sandbox pool was closed; create a new SandboxPool")
            try:
                return self._start_once()
            except BaseException:  # every host failed, or Ctrl-C midway (a notebook goes on):
                self.close()  # what it made is removed, not left half-started (never idle)
                raise

    def _start_once(self) -> SandboxPool:
        if self._started:
            return self
        with ThreadPoolExecutor(len(self._slots)) as connecting:  # a dead host costs a timeout
            problems = dict(zip(self._slots, connecting.map(self._connect_and_reap, self._slots)))
        self.stats.reap_removed = sum(slot.stats.reap_removed for slot in self._slots)
        problems.update(self._fill([slot for slot, p in problems.items() if p is None]))
        if self._closed:  # `close` from another thread meanwhile: not a started pool
            raise _closed_during_start()
        failed = {slot: p for slot, p in problems.items() if p is not None}
        if len(failed) == len(self._slots):  # `start` closes the pool
            first = next(iter(failed.values()))
            raise SandboxError(f"sandboxes failed to start on every host ({self.size} asked): "
                               f"{first}") from first
        for slot, problem in failed.items():
            self._mark_down(slot, problem)
        if self._routing:
            self._monitor = threading.Thread(target=self._watch, daemon=True,
                                             name="agentgym-pool-health")
            self._monitor.start()
        return self

    def _fill(self, slots: list[HostSlot]) -> dict[HostSlot, BaseException | None]:
        """Create the share of every slot in ``slots`` at once; return each one's first error."""
        with self._lock:  # counted, so a lease made meanwhile does not create extra ones
            self._started = True
            for slot in slots:
                slot.creating += slot.size
        try:
            futures = {slot: [self._workers.submit(self._create, slot) for _ in range(slot.size)]
                       for slot in slots}
        except RuntimeError:  # `close` shut the workers down meanwhile
            raise _closed_during_start() from None
        first_error: dict[HostSlot, BaseException | None] = {}
        for slot, created in futures.items():
            errors = [f.exception() for f in created if f.exception() is not None]
            for f in created:
                if f.exception() is None:
                    self._deliver(f.result())
            first_error[slot] = errors[0] if errors else None
        return first_error

    def _connect_and_reap(self, slot: HostSlot) -> BaseException | None:
        """Connect to the host and reap its leaked containers; return what failed, if anything."""
        try:
            slot.stats.reap_removed = len(_reap.reap_leaked(slot.connect()))
        except Exception as exc:
            return exc
        return None

    def close(self) -> None:
        """Remove every container of the pool; leases still out are closed on return."""
        self._closing.set()
        if self._monitor is not None:
            self._monitor.join()
        with self._lock:
            self._closed = True
            for slot in self._slots:
                slot.idle.clear()
            waiters, self._waiters = list(self._waiters), deque()
        for waiter in waiters:
            self._hand(waiter, _PoolClosed("the sandbox pool was closed while this lease "
                                           "waited for a sandbox"))
        self._workers.shutdown(wait=True, cancel_futures=True)  # in-flight resets/creates end
        with self._lock:
            everything = [sandbox for slot in self._slots for sandbox in slot.all]
            for slot in self._slots:
                slot.all.clear()
        for sandbox in everything:
            sandbox.close()
        for slot in self._slots:
            if not slot.down:
                self._remove_left_behind(slot)
            slot.close_clients()

    def __enter__(self) -> SandboxPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> SandboxPool:
        # cancelled midway, what the start made is closed, not leaked (`__aexit__` never runs)
        return await in_thread_to_the_end(self.start, after_cancel=self.close)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    @property
    def idle(self) -> int:
        """Sandboxes ready to lease right now."""
        return sum(len(slot.idle) for slot in self._slots)

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
            if snapshot is not None:  # cancelled, the restore ends before the sandbox goes back
                await in_thread_to_the_end(functools.partial(sandbox.restore, snapshot))
            yield lease
            ok = True
        finally:
            await lease.aend(failed=not ok)

    def _lease(self, sandbox: DockerSandbox) -> SandboxLease:
        return SandboxLease(sandbox, lambda failed: self._release(sandbox, failed))

    def _take_or_wait(self, waiter: _Waiter) -> DockerSandbox | None:
        with self._lock:
            if self._closed:  # start() cannot help: a closed pool stays closed
                raise SandboxError("the sandbox pool is not running: it was closed; create a "
                                   "new SandboxPool")
            if not self._started:
                raise SandboxError("the sandbox pool is not running (use `with pool:` or "
                                   "pool.start())")
            sandbox = self._take_idle()
            if sandbox is not None:
                return sandbox
            self._waiters.append(waiter)
            slot = self._claim_refill()  # an earlier creation failed: try again for this waiter
        if slot is not None:
            self._workers.submit(self._refill, slot)
        return None

    def _take_idle(self) -> DockerSandbox | None:
        """Lease an idle sandbox of the up host with the fewest leases out (lock held).

        Ties go to the host leased from least recently. One near its expiry is replaced
        instead (another agentgym may reap it soon).
        """
        while True:
            ready = [slot for slot in self._slots if slot.idle and not slot.down]
            if not ready:
                return None
            slot = min(ready, key=_least_busy)
            sandbox = slot.idle.popleft()
            if not sandbox.expiring:
                self._note_lease(slot)
                return sandbox
            self._workers.submit(self._recycle, sandbox, True)

    def _note_lease(self, slot: HostSlot) -> None:
        slot.leased += 1
        self.stats.leases += 1
        slot.last_lease = self.stats.leases
        slot.stats.leases += 1

    def _claim_refill(self) -> HostSlot | None:
        """Count a creation on a host short of its share and return that host (lock held).

        Up hosts come first (the fewest leases out); when every host is down, the one whose
        cool-off ends first is tried anyway: a lease should not wait for a health check.
        """
        short = [slot for slot in self._slots if slot.short > 0]
        up = [slot for slot in short if not slot.down]
        if up:
            slot = min(up, key=_least_busy)
        elif short and all(slot.down for slot in self._slots):
            slot = min(short, key=lambda s: s.retry_at)
        else:
            return None
        slot.creating += 1
        return slot

    def _refill(self, slot: HostSlot) -> None:
        """Create one sandbox on ``slot`` (already counted) and deliver it or the error."""
        try:
            sandbox = self._create(slot)
        except Exception as exc:
            self._creation_failed(slot, exc)
            return
        self._deliver(sandbox)

    def _creation_failed(self, slot: HostSlot, exc: BaseException) -> None:
        """Route around ``slot``: retry on another host, or give the error to the oldest waiter.

        The oldest waiter gets the error only when no other host is up (always so with one
        host), so a failing host costs no lease while another can serve it.
        """
        self._mark_down(slot, exc)
        with self._lock:
            others_up = any(not s.down for s in self._slots if s is not slot)
            retry = self._claim_refill() if others_up and self._waiters else None
        if retry is not None:
            self._refill(retry)  # on this worker: a failure marks that host down too
        elif not others_up:
            self._deliver(exc)

    def _acquire_sync(self, timeout: float | None) -> DockerSandbox:
        timeout = _lease_timeout(timeout)
        waiter = _Waiter()
        sandbox = self._take_or_wait(waiter)
        if sandbox is not None:
            return sandbox
        try:
            handed = waiter.event.wait(timeout)
        except BaseException:  # Ctrl-C while waiting: a sandbox handed over now is not lost
            self._withdraw_sync(waiter)
            raise
        if not handed:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                    raise self._no_sandbox(timeout)
            waiter.event.wait()
        return self._unwrap(waiter.item)

    async def _acquire_async(self, timeout: float | None) -> DockerSandbox:
        timeout = _lease_timeout(timeout)
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
        down = [slot.host.name for slot in self._slots if slot.down]
        return SandboxError(f"no sandbox free within {timeout}s (pool size {self.size}"
                            + (f"; hosts down: {', '.join(down)})" if down else ")"))

    def _withdraw_sync(self, waiter: _Waiter) -> None:
        """`_withdraw` for a blocking waiter: out of the queue, or pass on what it got."""
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                return
        waiter.event.wait()  # handed over: `_hand` sets the item right after the dequeue
        if isinstance(waiter.item, DockerSandbox):
            self._deliver(waiter.item)

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
        if isinstance(item, _PoolClosed):  # no creation failed: the pool went away
            raise SandboxError(str(item)) from None
        if isinstance(item, BaseException):
            raise SandboxError(f"sandbox creation failed: {item}") from item
        with self._lock:
            self._note_lease(self._host_of[item])
        return item

    # -- returning, recycling ---------------------------------------------------------------
    def _release(self, sandbox: DockerSandbox, failed: bool) -> None:
        with self._lock:
            closed = self._closed
            self._uses[sandbox] = uses = self._uses.get(sandbox, 0) + 1
            self._host_of[sandbox].leased -= 1
        if not closed:
            try:
                self._workers.submit(self._recycle, sandbox, failed or uses >= self.max_uses)
                return
            except RuntimeError:  # close() shut the workers down meanwhile
                pass
        sandbox.close()

    def _recycle(self, sandbox: DockerSandbox, replace: bool) -> None:
        """Reset ``sandbox`` and deliver it, or replace it with a fresh one on its host.

        On a host that is down it is dropped: the host is refilled when it answers again.
        """
        slot = self._host_of[sandbox]
        replace = replace or sandbox.expiring
        if not (replace or sandbox.needs_recycle or slot.down):
            try:
                sandbox.reset()
            except Exception as exc:  # the daemon failed even the replacement: drop it
                log.warning("reset of a pooled sandbox failed, replacing it: %s", exc)
                replace = True
        if slot.down:
            self._drop(sandbox)
        elif replace or sandbox.needs_recycle:
            with self._lock:
                slot.creating += 1
                self._count(slot, "recycled")
            self._drop(sandbox)
            self._refill(slot)
        else:
            self._deliver(sandbox)

    def _drop(self, sandbox: DockerSandbox) -> None:
        """Forget ``sandbox`` and remove its container."""
        with self._lock:
            slot = self._forget(sandbox)
        self._remove(slot, sandbox)

    def _remove(self, slot: HostSlot | None, sandbox: DockerSandbox) -> None:
        """Remove ``sandbox``'s container; note it on its host if the daemon did not answer."""
        sandbox.close()
        if sandbox.left_behind is not None and slot is not None:
            with self._lock:
                slot.left_behind.add(sandbox.left_behind)

    def _remove_left_behind(self, slot: HostSlot) -> None:
        """Remove the containers of ``slot`` whose removal failed while the host was away.

        Why: after a network cut they may still run, and no reaper takes a live owner's
        containers before their expiry. One try each: one still there waits for its expiry.
        """
        with self._lock:
            ids, slot.left_behind = slot.left_behind, set()
        for container_id in ids:
            try:
                slot.connect().api.remove_container(container_id, force=True)
            except Exception as exc:  # gone already, or the host went away again
                log.debug("removing left-behind container %s: %s", container_id[:12], exc)

    def _forget(self, sandbox: DockerSandbox) -> HostSlot | None:
        """Take ``sandbox`` out of the pool's books (lock held); return its host's slot."""
        slot = self._host_of.pop(sandbox, None)
        if slot is not None:
            slot.all.discard(sandbox)
        self._uses.pop(sandbox, None)
        return slot

    def _count(self, slot: HostSlot, name: str) -> None:
        """Add one to counter ``name`` of the pool and of ``slot``'s host (lock held)."""
        setattr(self.stats, name, getattr(self.stats, name) + 1)
        setattr(slot.stats, name, getattr(slot.stats, name) + 1)

    def _create(self, slot: HostSlot) -> DockerSandbox:
        """Start one sandbox on ``slot``; the caller counted it in ``slot.creating``.

        Within the host's caps: its ``starting`` semaphore, then its token bucket (in this
        order, so tokens are not spent by creations still queued behind the semaphore).
        """
        try:
            with slot.starting:
                if slot.bucket is not None:
                    slot.bucket.take(self._closing)
                sandbox = self._start_sandbox(slot)
            with self._lock:
                self._host_of[sandbox] = slot
                slot.all.add(sandbox)
                self._count(slot, "created")
                back = slot.down
                if back:  # it works again (a creation tried while every host was down)
                    self._set_down(slot, False)
            if back:
                log.warning("Docker host %r is back", slot.host.name)
        finally:
            with self._lock:
                slot.creating -= 1
        return sandbox

    def _start_sandbox(self, slot: HostSlot) -> DockerSandbox:
        """Create and start one container on ``slot``'s host; a failure is counted there."""
        sandbox = None
        try:
            sandbox = DockerSandbox(self.image, self.config, client=slot.connect(),
                                    host=slot.host, labels={POOL_LABEL: self.pool_id})
            return sandbox.start()
        except Exception:
            with self._lock:
                self._count(slot, "create_failures")
            if sandbox is not None:
                self._remove(slot, sandbox)
            raise

    def _deliver(self, item: DockerSandbox | BaseException) -> None:
        """Hand ``item`` to the oldest waiter, or park a sandbox as idle on its host.

        A sandbox whose host went down meanwhile is dropped instead (nothing leased there).
        """
        with self._lock:
            sandbox = item if isinstance(item, DockerSandbox) else None
            usable = not self._closed and (sandbox is None or not self._host_of[sandbox].down)
            waiter = self._waiters.popleft() if usable and self._waiters else None
            if usable and waiter is None:
                if sandbox is not None:
                    self._host_of[sandbox].idle.append(sandbox)
                return
        if waiter is not None:
            self._hand(waiter, item)
        elif sandbox is not None:
            self._drop(sandbox)

    # -- host health --------------------------------------------------------------------------
    def _set_down(self, slot: HostSlot, down: bool) -> None:
        """Flip ``slot``'s state (lock held); going down starts its cool-off."""
        if down:
            slot.retry_at = time.monotonic() + self.host_cooloff_s
            if not slot.down:
                slot.stats.marked_down += 1
        slot.stats.down = down

    def _mark_down(self, slot: HostSlot, reason: BaseException) -> None:
        """Route around ``slot`` for a cool-off and remove its idle sandboxes.

        With one host it does nothing: the pool keeps its warm sandboxes and, as before, a
        lease that finds it short tries a new creation.
        """
        if not self._routing:
            return
        with self._lock:
            newly = not slot.down
            self._set_down(slot, True)
            evicted, slot.idle = list(slot.idle), deque()
            for sandbox in evicted:
                self._forget(sandbox)
        if newly:
            log.warning("Docker host %r is down, routing around it for %gs: %s",
                        slot.host.name, self.host_cooloff_s, reason)
        for sandbox in evicted:  # on the workers: each removal may take the host's timeout
            try:
                self._workers.submit(self._remove, slot, sandbox)
            except RuntimeError:  # the pool is closing: its workers are gone
                self._remove(slot, sandbox)

    def _watch(self) -> None:
        """Health checks, every ``health_interval_s`` until `close` (own thread)."""
        while not self._closing.wait(self.health_interval_s):
            for slot in self._slots:
                self._check(slot)

    def _check(self, slot: HostSlot) -> None:
        """Ping ``slot``'s daemon: down on failure; after a cool-off, back; refilled if short."""
        if slot.down and time.monotonic() < slot.retry_at:
            return
        try:
            slot.ping()
        except Exception as exc:
            self._mark_down(slot, exc)
            return
        self._remove_left_behind(slot)
        with self._lock:
            back = slot.down
            self._set_down(slot, False)
            missing = max(0, slot.short)
            slot.creating += missing
        if back:
            log.warning("Docker host %r answers again; refilling %d sandbox(es)",
                        slot.host.name, missing)
        for _ in range(missing):
            self._workers.submit(self._refill, slot)

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


class _PoolClosed(SandboxError):
    """What a lease still waiting when the pool closes is handed (not a creation failure)."""


_WHOLE_MEANS = {
    "size": "the number of warm sandboxes",
    "max_concurrent_creates": "sandboxes starting at once per host",
    "max_uses": "leases before a sandbox is replaced",
}


def _positive_seconds(name: str, value: Any, means: str, allow_inf: bool = False) -> None:
    """A `ConfigError` unless ``value`` is a number > 0 (finite unless ``allow_inf``)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
            or value <= 0 or (math.isinf(value) and not allow_inf)):
        raise ConfigError(f"{name} must be a number > 0 ({means}), got {value!r}")


def _lease_timeout(timeout: Any) -> float | None:
    """A lease's wait: None (as long as it takes) or a finite number of seconds >= 0.

    Why up front: a string raised a bare ``TypeError`` from inside the wait and left the
    waiter queued, so the next sandbox returned went to it and was lost (the pool's next
    lease then hung); nan or a negative number gave up at once, as if the pool were full.
    """
    if timeout is None:
        return None
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout) or timeout < 0):
        raise ConfigError(f"lease timeout must be None (wait as long as it takes) or a finite "
                          f"number of seconds >= 0, got {timeout!r}")
    return float(timeout)


def _least_busy(slot: HostSlot) -> tuple[int, int]:
    return slot.leased, slot.last_lease


def _check_hosts(hosts: Sequence[DockerHost | str] | None, client: Any,
                 size: int) -> list[DockerHost]:
    """The pool's hosts (default: the environment's daemon), or a one-line `ConfigError`."""
    if hosts is None:
        return [DockerHost()]
    if client is not None:
        raise ConfigError("pass either hosts= or client= to SandboxPool, not both")
    targets = [DockerHost.parse(host) for host in hosts]
    names = [host.name for host in targets]
    if not targets or size < len(targets):
        raise ConfigError(f"SandboxPool needs 1 to size={size} hosts (one sandbox each at "
                          f"least), got {len(targets)}: raise size or give fewer hosts")
    if len(set(names)) != len(names):
        raise ConfigError(f"Docker host names must be unique in a pool, got {names}: "
                          "set DockerHost(name=...)")
    return targets


def _closed_during_start() -> SandboxError:
    """A `close` from another thread won over `SandboxPool.start`, which then refuses."""
    return SandboxError("this sandbox pool was closed while it started; create a new SandboxPool")

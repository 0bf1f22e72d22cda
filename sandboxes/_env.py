"""`SandboxToolEnv`: the rung of the env ladder for envs whose tools run code.

    ToolEnv -> SandboxToolEnv -> HumanEvalEnv (and any code-executing env)

An episode leases a sandbox in `setup_episode` and ends the lease in `teardown_episode`,
which the loop runs when the episode ends, is reset, or is closed after a cancellation; tools
and reward functions that declare a ``sandbox`` parameter get the episode's `SandboxLease`.
Docker sandboxes come from one warm `SandboxPool` per process and (image, config, size),
shared by every env instance (envs are made per episode, pools are not).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import multiprocessing.util
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from agentgym._errors import ConfigError, SandboxError
from agentgym._tool_env import ToolEnv
from agentgym._tools import Tool

from ._client import import_docker
from ._config import DEFAULT_IMAGE, DockerSandboxConfig, docker_config, missing_image_fix
from ._hosts import DockerHost
from ._lease import SandboxLease
from ._local import LocalSandbox
from ._pool import SandboxPool

RETRY_FIRST_S = 1.0
"""Seconds before the first retry of a pool start that failed; doubles per failure."""
RETRY_MAX_S = 30.0
"""Longest wait between two attempts to start a pool."""
READY_TIMEOUT_S = 10.0
"""Seconds `SandboxToolEnv.check_ready` gives each daemon to answer."""


SANDBOX_CALLS_PER_TURN = 2
"""Tool calls of one turn that run in a sandbox env. Why so few: an episode's calls share one
sandbox and run one after another, so more calls in a turn only add time; at 16 calls of 10 s
a turn a policy could run out a training step's deadline, and a late episode is dropped from
the step by default (``late_policy``), not scored. The cap bounds a turn, not an episode:
``max_turns`` x this x the sandbox call's timeout must stay under ``episode_deadline_s``."""


class SandboxToolEnv(ToolEnv):
    """A `ToolEnv` whose episodes each hold a sandbox, released when the episode ends.

    Args:
        tools: functions or `Tool`s; one that declares a ``sandbox`` parameter gets the
            episode's `SandboxLease` (a `Sandbox`), never shown to the model.
        backend: ``docker`` (hardened containers from a shared warm pool) or ``local``
            (a `LocalSandbox` per episode: NOT a security boundary, for trusted code only).
        image: the Docker image (build the default with ``agentgym sandbox build``).
        sandbox_config: the containers' hardening knobs, a `DockerSandboxConfig` or a mapping of
            its fields (what a YAML training config gives); None: `DockerSandboxConfig()`.
        pool_size: warm containers in the shared pool; episodes wait when all are out.
        sandbox_hosts: Docker hosts the pool spreads over (`DockerHost`s, addresses, or
            ``{url, cert_dir}`` mappings from a config file); None: the local daemon.
        lease_timeout: seconds an episode waits for a free sandbox, then `SandboxError`
            (the episode is ``infra_error``); None waits as long as it takes.
        kwargs: any `ToolEnv` option (``tasks``, ``rubric``, ``parser``, ``max_turns`` ...).
            ``max_tool_calls_per_turn`` defaults to `SANDBOX_CALLS_PER_TURN` here.

    Every sandbox failure of an episode (the pool cannot start, no sandbox in time) raises
    `SandboxError`, so the episode is ``infra_error``, never a reward of 0. A pool whose start
    failed is started again by a later episode, after ``RETRY_FIRST_S`` doubling up to
    ``RETRY_MAX_S``; the episodes that wait for that attempt share its outcome.

    Example::

        @tool
        async def shell(command: str, sandbox: Sandbox) -> str:
            '''Run a shell command.'''
            return (await sandbox.arun(command, language="bash")).stdout

        env = SandboxToolEnv([shell], tasks=[{"prompt": "How many CPUs?"}])
    """

    def __init__(
        self,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        *,
        backend: Literal["docker", "local"] = "docker",
        image: str = DEFAULT_IMAGE,
        sandbox_config: DockerSandboxConfig | Mapping[str, Any] | None = None,
        pool_size: int = 4,
        lease_timeout: float | None = None,
        sandbox_hosts: Sequence[str | Mapping[str, Any] | DockerHost] | None = None,
        **kwargs: Any,
    ) -> None:
        if backend not in ("docker", "local"):
            raise ConfigError(f"backend must be 'docker' or 'local', got {backend!r}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ConfigError(f"pool_size must be a whole number >= 1, got {pool_size!r}")
        if lease_timeout is not None and (
                isinstance(lease_timeout, bool) or not isinstance(lease_timeout, (int, float))
                or not 0 < lease_timeout < float("inf")):  # nan fails this too
            raise ConfigError(f"lease_timeout must be a finite number of seconds > 0 or None, "
                              f"got {lease_timeout!r}")
        kwargs.setdefault("max_tool_calls_per_turn", SANDBOX_CALLS_PER_TURN)
        super().__init__(tools, **kwargs)
        self.backend, self.image, self.pool_size = backend, image, pool_size
        self.sandbox_config = docker_config(sandbox_config, "sandbox_config")
        self.lease_timeout = lease_timeout
        self.sandbox_hosts = (
            tuple(DockerHost.parse(h) for h in sandbox_hosts) if sandbox_hosts else None
        )
        # what a machine must offer to run this env (tests and tools read it)
        self.metadata = {**self.metadata, "requires": ["docker"] if backend == "docker" else []}
        self.sandbox: SandboxLease | None = None
        """The running episode's lease; None between episodes."""
        self.pool: SandboxPool | None = None
        """The shared pool the last episode leased from (``docker``); its ``stats`` are the
        ``sandbox/*`` metrics."""
        self._lease_exit: Any = None  # the pool lease's context manager, exited at teardown

    def check_ready(self) -> None:
        """Raise `SandboxError` (one line, naming the fix) when no host could give a sandbox.

        Why: a pool finds a dead daemon or a missing image only at its first lease, so a
        training run loaded its model and then ended every episode ``infra_error``; callers
        that are about to start work (the trainer's preflight) ask here first. Every host is
        asked (daemon up, ``image`` present); one usable host is enough, as for a pool.
        """
        if self.backend != "docker":
            return
        hosts = self.sandbox_hosts or (DockerHost(),)
        problems = [_host_problem(host, self.image) for host in hosts]
        if all(problems):
            raise SandboxError(problems[0])

    async def setup_episode(self, task: dict[str, Any]) -> None:
        """Lease the episode's sandbox (raises `SandboxError` when there is none)."""
        await super().setup_episode(task)
        if self.backend == "local":
            local = LocalSandbox()
            self.sandbox = SandboxLease(local, lambda failed: local.close())
            return
        slot = _slot(self.image, self.sandbox_config, self.pool_size, self.sandbox_hosts)
        self.pool = await slot.apool()
        lease = self.pool.alease(timeout=self.lease_timeout)
        self.sandbox = await lease.__aenter__()
        self._lease_exit = lease

    async def teardown_episode(self) -> None:
        """End the lease: running code killed and awaited, then the sandbox goes back.

        Runs on every way out of an episode, a cancelled one included; the sandbox returns
        even if this await is cancelled again (it then returns a moment later).
        """
        lease, self.sandbox = self.sandbox, None
        exit_lease, self._lease_exit = self._lease_exit, None
        try:
            if exit_lease is not None:
                await exit_lease.__aexit__(None, None, None)
            elif lease is not None:
                await lease.aend()
        finally:
            await super().teardown_episode()


def _host_problem(host: DockerHost, image: str) -> str | None:
    """Why ``host`` cannot give a sandbox of ``image`` (unreachable, no such image), or None."""
    try:
        client = host.connect(timeout=READY_TIMEOUT_S)
    except SandboxError as exc:
        return str(exc)
    try:
        client.images.get(image)
    except import_docker().errors.ImageNotFound:
        return f"image {image!r} not found on host {host.name!r}: {missing_image_fix(image)}"
    except Exception as exc:
        return f"cannot inspect image {image!r} on host {host.name!r}: {type(exc).__name__}: {exc}"
    finally:
        client.close()
    return None


@dataclass
class _PoolSlot:
    """The shared pool of one (image, config, size), and how its last start went."""

    image: str
    config: DockerSandboxConfig
    size: int
    hosts: tuple[DockerHost, ...] | None = None
    pool: SandboxPool | None = None
    attempts: int = 0
    failures: int = 0  # consecutive failed starts
    retry_at: float = 0.0  # time.monotonic() before which no new start is tried
    error: str = ""
    closed: bool = False  # by `close_shared_pools`: no pool starts here again (see `_start`)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def apool(self) -> SandboxPool:
        """The started pool; starts (or restarts) it when there is none or it was closed."""
        pool = self.pool
        if pool is not None and not pool.closed:
            return pool
        delay = self.retry_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        return await asyncio.to_thread(self._start, self.attempts)

    def _start(self, seen: int) -> SandboxPool:
        """Start the pool (or return the one another episode started meanwhile).

        Refuses on a slot that `close_shared_pools` closed: the registry forgot it, so a pool
        started through it (by an episode that began before the close) would be closed by no
        later `close_shared_pools`, nor at exit, and its containers would run on unseen.
        """
        with self.lock:
            if self.closed:
                raise SandboxError(f"the sandbox pool for {self.image!r} was closed by "
                                   f"close_shared_pools() while this episode was starting; "
                                   f"close the shared pools only once every episode has ended")
            if self.pool is not None and not self.pool.closed:
                return self.pool
            if self.attempts != seen:  # the attempt this episode waited for failed
                raise SandboxError(f"the sandbox pool for {self.image!r} failed to start: "
                                   f"{self.error}")
            self.attempts += 1
            pool = SandboxPool(
                size=self.size, image=self.image, config=self.config,
                hosts=list(self.hosts) if self.hosts else None,
            )  # fmt: skip
            try:
                pool.start()
            except Exception as exc:
                self.failures += 1
                wait = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (self.failures - 1))
                self.retry_at = time.monotonic() + wait
                self.error = f"{type(exc).__name__}: {exc}"
                raise SandboxError(f"the sandbox pool for {self.image!r} failed to start "
                                   f"({self.error}); a later episode retries in {wait:g}s"
                                   ) from exc
            self.pool, self.failures, self.error = pool, 0, ""
            return pool


_SLOTS: dict[tuple[str, str, int, str], _PoolSlot] = {}
_SLOTS_LOCK = threading.Lock()


def _slot(
    image: str, config: DockerSandboxConfig, size: int, hosts: tuple[DockerHost, ...] | None
) -> _PoolSlot:
    key = (image, json.dumps(asdict(config), sort_keys=True), size, repr(hosts))
    with _SLOTS_LOCK:
        slot = _SLOTS.get(key)
        if slot is None:
            slot = _SLOTS[key] = _PoolSlot(image, config, size, hosts)
            _close_at_exit()
        return slot


@functools.cache
def _close_at_exit() -> None:
    """One exit hook for every shared pool of this process, registered with its first pool.

    Why both: ``atexit`` covers an interpreter that exits; a multiprocessing child (a fork-mode
    `AsyncVectorEnv` worker) ends with ``os._exit``, which skips ``atexit``, but runs the
    `Finalize` callbacks of its own pid first, so its containers go at ``envs.close()``. Where
    both run, the second finds no pool left.
    """
    atexit.register(close_shared_pools)
    multiprocessing.util.Finalize(None, close_shared_pools, exitpriority=0)


if hasattr(os, "register_at_fork"):  # a forked child must not lease from its parent's pools

    def _forget_parent_pools() -> None:
        """Forget the parent's pools without closing them: their containers are the parent's.

        The child's first episode then starts a pool of its own (its threads, its sockets).
        """
        global _SLOTS_LOCK
        _SLOTS.clear()
        _SLOTS_LOCK = threading.Lock()  # a thread of the parent may have held it at the fork
        _close_at_exit.cache_clear()  # the parent's hooks are not the child's: register anew

    os.register_at_fork(after_in_child=_forget_parent_pools)


def shared_pool_metrics() -> dict[str, float]:
    """The counters of this process's shared pools, summed, as ``sandbox/*`` ({} for none).

    Why: a training run's metrics should show that its rewards ran in sandboxes (``leases``),
    what churned (``created``, ``recycled``, ``create_failures``) and what a start reaped
    (``reap_removed``: the containers of a run killed with ``-9``), without reaching into envs.
    """
    with _SLOTS_LOCK:
        pools = [slot.pool for slot in _SLOTS.values() if slot.pool is not None]
    counters = ("created", "recycled", "leases", "reap_removed", "create_failures")
    return {f"sandbox/{name}": float(sum(getattr(pool.stats, name) for pool in pools))
            for name in counters} if pools else {}


def close_shared_pools() -> None:
    """Remove the shared pools' containers now and forget the pools.

    Runs at interpreter exit too; call it earlier when done with an env (tests, long-lived
    processes). The next episode starts a new pool; an episode that was still starting one
    gets `SandboxError` (``infra_error``) instead of a pool nothing would close.
    """
    _close_slots(lambda key, slot: True)


@contextlib.contextmanager
def closing_new_shared_pools() -> Iterator[None]:
    """Close, on leaving the block, the shared pools of the slots made inside it.

    Why: a caller that plays episodes for a moment (`agentgym.check`) must not leave their
    warm containers running until the process exits, nor close the pools the process had
    before it (a notebook's warm pool, a rollout running beside it in another thread, whose
    episodes then end ``infra_error``): `close_shared_pools` closes them all.

    A slot is the block's when its ``_SLOTS`` key was not there on entry, or holds another
    slot (the registry was cleared meanwhile and the slot made anew). A slot there on entry
    whose pool was not started yet (its start failed and waits to retry, or another thread's
    episode is starting it now) is left open even if the block's episodes start its pool: the
    slot was made by an episode of the caller's, whose episodes lease from that same pool, so
    closing it would fail them; its containers are closed as a pool started before the block
    would be (`close_shared_pools`, or at exit).
    """
    with _SLOTS_LOCK:
        before = dict(_SLOTS)
    try:
        yield
    finally:
        _close_slots(lambda key, slot: before.get(key) is not slot)


def _close_slots(chosen: Callable[[tuple[str, str, int, str], _PoolSlot], bool]) -> None:
    """Forget the slots ``chosen(key, slot)`` picks, mark them closed and close their pools."""
    with _SLOTS_LOCK:
        picked = {key: slot for key, slot in _SLOTS.items() if chosen(key, slot)}
        for key in picked:
            del _SLOTS[key]
    for slot in picked.values():
        with slot.lock:
            pool, slot.pool, slot.closed = slot.pool, None, True
        if pool is not None:
            pool.close()

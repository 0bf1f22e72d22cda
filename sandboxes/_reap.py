"""Ownership labels and reaping: no agentgym container outlives the process that made it.

Every container carries ``agentgym.managed=1``, ``agentgym.owner=<pid>``,
``agentgym.owner_start=<start time of that pid>`` (so a recycled pid is not mistaken for the
owner), ``agentgym.host=<hostname>``, ``agentgym.session=<id>`` and, unless the config
says otherwise, ``agentgym.expires=<unix time>``. Reaping removes the containers whose owner
on this host is gone, and those past their expiry whoever owns them: at pool start (on every
host of the pool), at interpreter exit (atexit, for this process's own containers) and from
``agentgym sandbox prune``. A process killed with ``-9`` runs no atexit hook, but its
containers stop with it anyway (their lifeline, see ``_docker.py``) and the daemon removes
them; reaping is for what that misses (a container whose stop or removal failed, one made
before the lifeline). Only the owner's machine can tell whether the owner lives, so the
expiry is what frees the containers of a wedged (or vanished) process on another machine
that shares a daemon.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
import uuid
from typing import Any

from agentgym._pid import process_alive

from ._channel import close_stream

MANAGED = "agentgym.managed"
OWNER = "agentgym.owner"
OWNER_START = "agentgym.owner_start"
HOST = "agentgym.host"
SESSION = "agentgym.session"
POOL = "agentgym.pool"  # set by SandboxPool: the pool_id a container belongs to
EXPIRES = "agentgym.expires"  # unix time after which anyone may reap it, live owner or not

PROCESS_SESSION = uuid.uuid4().hex[:12]
"""Identifies this interpreter's containers (one value per process)."""

# Strong references: a sandbox the caller dropped without close() (``DockerSandbox().run(...)``)
# still has a container, which only the atexit hook removes; a WeakSet forgot it, and the
# container outlived the process. `DockerSandbox.close` untracks.
_live: set[Any] = set()
_lock = threading.Lock()


def _forget_parent_sandboxes() -> None:
    """In a forked child: the copied sandboxes are the parent's, not this exit hook's to close.

    Why: a child that exited normally (``os.fork`` then ``sys.exit``) removed its parent's
    containers from under it. Their lifelines' copies are closed (not shut down, which would
    end the parent's connection too): a child that held them kept the parent's containers up
    after the parent died.
    """
    global _lock
    for sandbox in list(_live):
        lifeline, sandbox._lifeline = getattr(sandbox, "_lifeline", None), None
        if lifeline is not None:
            close_stream(lifeline, shutdown=False)
    _live.clear()
    _lock = threading.Lock()  # a thread of the parent may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_sandboxes)


def process_start_time(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def ownership_labels(extra: dict[str, str] | None = None,
                     lifetime_s: float | None = None) -> dict[str, str]:
    """Labels for a container owned by this process; it expires ``lifetime_s`` from now."""
    pid = os.getpid()
    expiry = {} if lifetime_s is None else {EXPIRES: f"{time.time() + lifetime_s:.3f}"}
    return {
        MANAGED: "1",
        OWNER: str(pid),
        OWNER_START: process_start_time(pid) or "",
        HOST: socket.gethostname(),
        SESSION: PROCESS_SESSION,
        **expiry,
        **(extra or {}),
    }


def expires_at(labels: dict[str, str]) -> float | None:
    """The container's expiry (unix time), or None when it has none."""
    try:
        return float(labels[EXPIRES])
    except (KeyError, ValueError):
        return None


def expired(labels: dict[str, str]) -> bool:
    """True once the container is past its expiry (by this machine's clock)."""
    expiry = expires_at(labels)
    return expiry is not None and expiry < time.time()


def owner_alive(labels: dict[str, str]) -> bool:
    """True when the container's owner process still runs (only checkable on this host).

    Where ``/proc`` is missing (macOS) only the pid can be checked, so a recycled pid keeps a
    leaked container alive until ``agentgym sandbox prune --all``.
    """
    if labels.get(HOST) != socket.gethostname():
        return True  # another machine's container: never ours to judge
    try:
        pid = int(labels.get(OWNER, ""))
    except ValueError:
        return False
    if not os.path.exists("/proc/self/stat"):
        return process_alive(pid)
    started = process_start_time(pid)
    recorded = labels.get(OWNER_START) or started  # "": the start time was unknown
    return started is not None and started == recorded


def managed_containers(client: Any) -> list[Any]:
    """Every agentgym container the daemon knows, running or not.

    ``ignore_removed``: docker-py inspects each listed container, and one that another
    process's reaper removed in between raised NotFound, failing this pool's start.
    """
    return client.containers.list(
        all=True, filters={"label": f"{MANAGED}=1"}, ignore_removed=True
    )


def reap_leaked(client: Any, everything: bool = False) -> list[str]:
    """Remove containers whose owner is gone or that expired (or all); return their short ids.

    ``client`` is one daemon's; a pool calls this for each of its hosts.
    """
    removed = []
    for container in managed_containers(client):
        labels = container.labels
        if everything or expired(labels) or not owner_alive(labels):
            try:
                container.remove(force=True)
                removed.append(container.short_id)
            except Exception:  # already gone, or being removed by someone else
                continue
    return removed


def track(sandbox: Any) -> None:
    """Remember a live sandbox so the atexit hook can close it."""
    with _lock:
        _live.add(sandbox)


def untrack(sandbox: Any) -> None:
    """Forget a closed sandbox."""
    with _lock:
        _live.discard(sandbox)


@atexit.register
def _close_all() -> None:
    with _lock:
        sandboxes = list(_live)
    for sandbox in sandboxes:
        try:
            sandbox.close()
        except Exception:
            continue

"""Temporary folders owned by a process, removed by the next start of their kind once it is dead.

Why: a process removes its temporary folders at exit (an ``atexit`` hook, a ``finally``), but
one killed with SIGKILL, or with a SIGTERM it has no handler for, runs neither, and a user
who starts ``agentgym train`` or ``eval`` again and again, and sometimes kills it, found the
temp dir filling up with vLLM server logs, vLLM socket folders and MCP workspace copies.

How: `make_dir` names a folder ``PREFIX<pid>-<host>-XXXXXXXX`` (the pid is for people; the host
is a short hash of this machine's boot id) and holds an exclusive ``flock`` on it for the life of
the process: the kernel drops the lock however the process ends. Before its first folder of a
kind, a process removes every folder of that kind whose lock is free (`sweep`): its owner is
dead, whatever process has its pid now. A folder is made under a hidden name and renamed once
locked, so no sweep sees it unlocked. A process forked from the owner (without exec) shares the
lock: the folder stays while it lives too.
A folder that could not be locked (a temp dir on a file system without locks) keeps its hidden
name, which no sweep takes.

A sweep takes only this machine's folders (the tag is a hash of the running kernel's boot id,
which every container on the machine shares): with the temp dir on a file system several
machines share (NFS), a lock may not be seen from another machine, so another machine's live
folder would look dead, and a dead machine's lock may linger; another machine's folders are
left for its own next sweep. Folders of this machine's earlier boots (a temp dir that outlives
a reboot) carry another tag and are not swept.
Folders named before the host tag (``PREFIX<pid>-XXXXXXXX``) are swept as before, by any host:
they name no host, and left alone they would stay for good.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import socket
import tempfile
import threading
from pathlib import Path

#: The lock (an open descriptor of the folder) of each folder of this process, by path.
_locks: dict[Path, int] = {}
#: The (temp dir, prefix) pairs this process swept already: one sweep each is enough.
_swept: set[tuple[str, str]] = set()
_guard = threading.Lock()  # MCP makes its folders in worker threads

#: What a `keep` adds after the prefix: a kept folder is the user's, never swept.
KEPT = "kept-"


def _kernel_tag() -> str:
    """8 hex characters naming this machine's running kernel (its boot id), else its host name.

    Why the kernel, not the host name: a ``flock`` holds for every process of one kernel, the
    containers on it included (each has a host name of its own, so containers sharing a temp
    dir never swept each other's dead folders), and may not be seen from another machine's.
    """
    try:
        ident = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # not Linux
        ident = socket.gethostname()
    return hashlib.sha256(ident.encode()).hexdigest()[:8]


#: This machine in the names of its folders: sweeps on other machines sharing the temp dir skip
#: them (`_kernel_tag`).
HOST = _kernel_tag()


def make_dir(prefix: str) -> Path:
    """A new folder ``PREFIX<pid>-<host>-XXXXXXXX`` in the temp dir, locked while we live.

    The first call for ``prefix`` (per temp dir) first removes the folders of dead owners
    (`sweep_once`).
    """
    temp = sweep_once(prefix)
    hidden = tempfile.mkdtemp(prefix=f".{prefix}{os.getpid()}-{HOST}-", dir=temp)
    fd = _lock(hidden)
    if fd is None:  # no lock (a file system without them, no descriptor left): never swept
        return Path(hidden)
    path = Path(temp, os.path.basename(hidden)[1:])
    os.rename(hidden, path)
    with _guard:
        _locks[path] = fd
    return path


def remove(path: Path) -> None:
    """Delete ``path`` (a folder of `make_dir`) and drop its lock."""
    remove_tree(str(path))
    _unlock(path)


def keep(path: Path) -> Path:
    """Rename ``path`` (a folder of `make_dir`) out of every sweep; its new path.

    For a folder whose content the user is told to read (the log of a failed start): the next
    start must not remove it before they do. ``PREFIX<pid>-<host>-X`` becomes
    ``PREFIXkept-<pid>-<host>-X``.
    """
    head, pid, host, rest = path.name.rsplit("-", 3)
    kept = path.with_name(f"{head}-{KEPT}{pid}-{host}-{rest}")
    try:
        os.rename(path, kept)
    except OSError:
        return path
    _unlock(path)
    return kept


def sweep_once(prefix: str, *, in_thread: bool = False) -> str:
    """`sweep` the temp dir for ``prefix`` unless this process did already; the temp dir.

    Call it first where `make_dir` must be quick (on an event loop): a sweep may delete a lot
    (3,000 folders of killed runs held a loop 1 to 3.5 s). ``in_thread`` sweeps in a daemon
    thread named ``agentgym-sweep-<prefix>`` and returns at once, for a caller that cannot
    await (a constructor); a sweep cut short at exit is finished by the next process's.
    """
    temp = tempfile.gettempdir()
    with _guard:
        first = (temp, prefix) not in _swept
        _swept.add((temp, prefix))
    if first and in_thread:
        threading.Thread(target=sweep, args=(prefix, temp), name=f"agentgym-sweep-{prefix}",
                         daemon=True).start()  # fmt: skip
    elif first:
        sweep(prefix, temp)
    return temp


def sweep(prefix: str, temp: str | None = None) -> int:
    """Remove the folders of ``prefix`` in ``temp`` (the temp dir) whose owner is dead.

    Returns how many it removed. A folder another user owns, one it cannot open, and one of
    another host stay.
    """
    temp = temp or tempfile.gettempdir()
    # this host's, or named before the host tag; then mkdtemp's 8 characters
    pattern = re.compile(re.escape(prefix) + rf"\d+-(?:{HOST}-)?[a-z0-9_]{{8}}")
    try:
        names = [name for name in os.listdir(temp) if pattern.fullmatch(name)]
    except OSError:
        return 0
    removed = 0
    for name in names:
        path = os.path.join(temp, name)
        fd = _lock(path)
        if fd is None:  # its owner (or a process forked from it) lives, or not ours to open
            continue
        try:
            if os.fstat(fd).st_uid == os.getuid():  # root leaves other users' folders alone
                remove_tree(path)
                removed += not os.path.lexists(path)
        finally:
            os.close(fd)
    return removed


def remove_tree(path: str) -> None:
    """``rmtree`` that first makes every directory ours to list and empty (never raises).

    Why: code that chmod'ed a folder 000 left it behind with its files, and every later
    process retried its sweep in vain.
    """
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    for top, dirs, _ in os.walk(path, onerror=lambda _exc: None):  # top-down: before entering
        for name in dirs:
            full = os.path.join(top, name)
            if not os.path.islink(full):
                with contextlib.suppress(OSError):
                    os.chmod(full, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def _lock(path: str) -> int | None:
    """An open descriptor of folder ``path`` holding its lock; None if held or not openable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _unlock(path: Path) -> None:
    with _guard:
        fd = _locks.pop(path, None)
    if fd is not None:
        os.close(fd)

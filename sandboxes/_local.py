"""`LocalSandbox`: a subprocess with rlimits, for machines without Docker. NOT isolation."""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from agentgym import _owned_tmp
from agentgym._errors import ConfigError, SandboxError
from agentgym._stop import running_loop

from ._protocol import (
    Files,
    SandboxBase,
    check_call_args,
    check_relative,
    check_timeout,
    language_argv,
    running_call,
    to_bytes,
)
from ._result import ExecResult, ExecStatus

WARNING = ("LocalSandbox is NOT a security boundary: the code runs as your user, on your "
           "filesystem and network, limited only by rlimits. Use DockerSandbox for untrusted code.")
_warned = threading.Event()
#: The `_owned_tmp` prefix of a sandbox's own folder, which holds its work dir and the fresh
#: work dirs of its ``fresh_workdir`` calls: a process killed with -9 (or by a SIGTERM it had
#: no handler for) runs no finalizer, so these were left in the temp dir for good; now the
#: next process's first LocalSandbox removes them. The work dir is a child of the locked
#: folder because ``reset`` deletes and recreates it, which would drop a lock held on it.
OWNED_PREFIX = "agentgym-local-"


@dataclass(frozen=True)
class LocalSandboxConfig:
    """Resource limits of a `LocalSandbox` (rlimits of each child process)."""

    mem_limit_mb: int = 1024
    """``RLIMIT_AS`` in MiB (address space, so set it well above the resident size)."""
    fsize_mb: int = 64
    """``RLIMIT_FSIZE`` in MiB: largest file the code may write."""
    nofile: int = 256
    """``RLIMIT_NOFILE``."""
    nproc: int | None = None
    """``RLIMIT_NPROC``; counts every process of your uid, so None (unlimited) by default."""
    output_limit_bytes: int = 1 << 20
    """Cap on stdout + stderr of one call; past it the process group is killed."""
    default_timeout: float = 10.0
    """Seconds a call may run when no ``timeout`` is given (also sets ``RLIMIT_CPU``)."""

    def __post_init__(self) -> None:
        """Check values."""
        for name in ("mem_limit_mb", "fsize_mb", "nofile", "output_limit_bytes", "nproc"):
            value = getattr(self, name)
            if name == "nproc" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a whole number > 0, got {value!r}")
        check_timeout(self.default_timeout, "default_timeout")  # nan, inf: every call refused

    def limits_text(self) -> str:
        """The rlimits as the config names them, for an error about them."""
        return ", ".join(f"{name}={getattr(self, name)}" for name in _RLIMIT_FIELDS)


#: The fields that become a child's rlimits (`LocalSandbox._limits`).
_RLIMIT_FIELDS = ("mem_limit_mb", "fsize_mb", "nofile", "nproc")


class LocalSandbox(SandboxBase):
    r"""Runs code in a child process on this machine. It is NOT a security boundary.

    Each call is a new process in its own session (``start_new_session``) and temp work dir,
    with a scrubbed environment and rlimits (CPU, address space, file size, open files). The
    timeout kills the process group; a child that calls ``setsid`` itself escapes the group,
    the filesystem and network are yours. HumanEval-style harnesses use the same approach and
    say the same thing. Use it for trusted code or machines without Docker; it warns once.

    Example::

        with LocalSandbox() as sb:
            assert sb.run("print(2 + 2)").stdout == "4\n"
    """

    def __init__(self, config: LocalSandboxConfig | None = None) -> None:
        if not _warned.is_set():
            _warned.set()
            warnings.warn(WARNING, UserWarning, stacklevel=2)
        self.config = config or LocalSandboxConfig()
        if running_loop() is not None:  # its sweep held every task (3,000 folders: 1-3.5 s)
            _owned_tmp.sweep_once(OWNED_PREFIX, in_thread=True)
        self._home = _owned_tmp.make_dir(OWNED_PREFIX)
        self.workdir = str(self._home / "work")
        os.mkdir(self.workdir, 0o700)
        # A sandbox never closed (dropped, or passed inline as verify(..., sandbox=
        # LocalSandbox())) left its work dir, with what the code wrote, in /tmp for good.
        # The finalizer runs at garbage collection or at interpreter exit, holds no reference
        # to the sandbox, and is what close() calls too.
        self._remove_workdir = weakref.finalize(self, _remove_dir, self._home, os.getpid())
        self._closed = False
        self._running: set[int] = set()  # process groups of the calls running now

    def run(self, code: str, language: str = "python", stdin: str | bytes | None = None,
            files: Files | None = None, timeout: float | None = None, *,
            session: bool | None = None, end_session: bool = False,
            fresh_workdir: bool = False) -> ExecResult:
        """Run ``code`` in a fresh process.

        ``session`` and ``end_session`` are accepted and ignored: there is no session, and a
        call's process group ends with it. ``fresh_workdir`` (verify asks for it): the call
        gets a new empty work dir of its own (and TMPDIR), deleted after it, so it sees
        nothing earlier calls left there and leaves nothing for later ones; the sandbox's
        own work dir, and calls running beside it, are untouched.
        """
        check_call_args("code", code, stdin, files)
        argv = language_argv(language, code) or [sys.executable, "-I", "-c", code]
        if not fresh_workdir:
            return self.exec(argv, stdin=stdin, files=files, timeout=timeout)
        self._refuse_if_closed()
        workdir = tempfile.mkdtemp(prefix="call-", dir=self._home)
        try:
            return self._exec(argv, stdin, files, timeout, workdir)
        finally:
            _owned_tmp.remove_tree(workdir)

    def exec(self, argv: Sequence[str], stdin: str | bytes | None = None,
             files: Files | None = None, timeout: float | None = None) -> ExecResult:
        """Run ``argv`` in the work dir."""
        return self._exec(argv, stdin, files, timeout, self.workdir)

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise SandboxError("this LocalSandbox is closed (its work dir is deleted); make a "
                               "new LocalSandbox() for more calls")

    def _exec(self, argv: Sequence[str], stdin: str | bytes | None, files: Files | None,
              timeout: float | None, workdir: str) -> ExecResult:
        """Run ``argv`` in ``workdir``."""
        check_call_args("argv", argv, stdin, files)
        timeout = check_timeout(self.config.default_timeout if timeout is None else timeout)
        self._refuse_if_closed()
        started = time.monotonic()
        for path in files or {}:
            check_relative(path)
        for path, content in (files or {}).items():
            try:
                self._write(workdir, path, to_bytes(content) or b"")
            except (OSError, ValueError) as exc:  # too long a name, no space: DockerSandbox's
                return _not_run(f"sandbox: cannot write {path!r}: {type(exc).__name__}: {exc}",
                                started)
        group = _CallGroup()
        with running_call(group.kill):
            try:
                proc = subprocess.Popen(
                    [str(a) for a in argv], cwd=workdir, env=self._env(workdir),
                    start_new_session=True,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    preexec_fn=self._limits(timeout),
                )
            except OSError as exc:  # no such command, not executable: the command's `error`
                return _not_run(f"{exc.filename or argv[0]}: {exc.strerror}", started, 127)
            except ValueError as exc:  # a NUL byte in argv
                return _not_run(f"sandbox: cannot run {argv[0]!r:.80}: {exc}", started)
            except subprocess.SubprocessError:  # `_limits` raised in the child: it says no more
                raise ConfigError(
                    f"LocalSandbox cannot set its limits ({self.config.limits_text()}): one is "
                    "over this machine's hard limit (`ulimit -Ha`); lower it in "
                    "LocalSandboxConfig"
                ) from None
            group.started(proc.pid)
            self._running.add(proc.pid)
            try:
                _feed(proc, to_bytes(stdin) or b"")
                out, err, status = _collect(proc, started + timeout,
                                            self.config.output_limit_bytes)
                if status is None:  # its output ended: let it exit before its group is killed
                    try:  # (killed while exiting, `echo` ended -9: an `error` with its output)
                        proc.wait(timeout=max(0.0, started + timeout - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        status = ExecStatus.TIMEOUT
            finally:
                self._running.discard(proc.pid)
                _kill_group(proc.pid)
        code = proc.wait()
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None  # opened with PIPE
            stream.close()
        if status is None:
            status = (ExecStatus.OOM if code != 0 and b"MemoryError" in err[-200:] else
                      ExecStatus.TIMEOUT if code == -signal.SIGXCPU else
                      ExecStatus.OK if code == 0 else ExecStatus.ERROR)
        return ExecResult(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), code,
                          time.monotonic() - started, status,
                          status is ExecStatus.OUTPUT_LIMIT)

    def interrupt(self) -> None:
        """Kill the process group of every call running now (each call then returns)."""
        for pid in list(self._running):
            _kill_group(pid)

    def reset(self) -> None:
        """Empty the work dir (kill the calls running now first)."""
        if self._closed:
            raise SandboxError("this LocalSandbox is closed; make a new LocalSandbox()")
        self.interrupt()
        _owned_tmp.remove_tree(self.workdir)
        os.makedirs(self.workdir, mode=0o700, exist_ok=True)

    def close(self) -> None:
        """Kill the calls running now and delete the work dir; later calls raise `SandboxError`."""
        self._closed = True
        self.interrupt()
        self._remove_workdir()

    def _write(self, workdir: str, path: str, content: bytes) -> None:
        """Write one file of a call (``path`` checked by `check_relative` already)."""
        full = os.path.join(workdir, os.path.normpath(path))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as fh:
            fh.write(content)

    def _env(self, workdir: str) -> dict[str, str]:
        """The environment of a call in ``workdir`` (its HOME and TMPDIR).

        ``workdir`` is the sandbox's work dir, or a ``fresh_workdir`` call's own.
        """
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8",
                "TMPDIR": workdir, "PYTHONDONTWRITEBYTECODE": "1"}

    def _limits(self, timeout: float) -> Callable[[], None]:
        cfg, mib = self.config, 1024 * 1024
        limits = [(resource.RLIMIT_CPU, int(timeout) + 1),
                  (resource.RLIMIT_AS, cfg.mem_limit_mb * mib),
                  (resource.RLIMIT_FSIZE, cfg.fsize_mb * mib),
                  (resource.RLIMIT_NOFILE, cfg.nofile), (resource.RLIMIT_CORE, 0)]
        if cfg.nproc is not None:
            limits.append((resource.RLIMIT_NPROC, cfg.nproc))

        def apply() -> None:
            for which, value in limits:
                resource.setrlimit(which, (value, value))

        return apply


class _CallGroup:
    """The process group of one call, which a cancel may kill before it exists.

    Why: ``CallToken.cancel`` can arrive while ``Popen`` still runs, before the pid is known;
    a kill then found nothing and the cancelled ``arun`` waited for the code's whole
    timeout. A kill that comes first is remembered and done as soon as the group exists.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._killed = False

    def kill(self) -> None:
        """Kill the group now, or as soon as `started` names it."""
        with self._lock:
            self._killed = True
            if self._pid is not None:
                _kill_group(self._pid)

    def started(self, pid: int) -> None:
        """The call's process (its group leader) exists; kill it if a kill came first."""
        with self._lock:
            self._pid = pid
            if self._killed:
                _kill_group(pid)


def _not_run(why: str, started: float, exit_code: int | None = None) -> ExecResult:
    """The `error` result of a call whose command never ran (DockerSandbox's wording)."""
    return ExecResult("", why + "\n", exit_code, time.monotonic() - started, ExecStatus.ERROR)


def _remove_dir(path: Path, owner_pid: int) -> None:
    """Delete a sandbox's own folder (`OWNED_PREFIX`), but only in the process that made it.

    Why the pid: a forked child inherits the finalizer and would delete the parent's dir
    when it exits.
    """
    if os.getpid() == owner_pid:
        _owned_tmp.remove(path)


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    """Write ``data`` to the child's stdin from a daemon thread, then close it (EOF)."""
    stdin = proc.stdin
    assert stdin is not None  # opened with PIPE

    def write() -> None:
        with contextlib.suppress(OSError):  # the child exited or closed its stdin early
            stdin.write(data)
        with contextlib.suppress(OSError):
            stdin.close()

    threading.Thread(target=write, daemon=True).start()


def _collect(proc: subprocess.Popen[bytes], deadline: float,
             limit: int) -> tuple[bytes, bytes, ExecStatus | None]:
    """Read stdout/stderr until exit, the deadline, or the cap."""
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None  # opened with PIPE
    bufs: dict[IO[bytes], bytearray] = {stdout: bytearray(), stderr: bytearray()}
    total = 0
    with selectors.DefaultSelector() as sel:
        for stream in bufs:
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(bufs[stdout]), bytes(bufs[stderr]), ExecStatus.TIMEOUT
            events = sel.select(min(remaining, 0.05))
            if not events and proc.poll() is not None:
                # it may have written and exited after the select above returned: read that
                events = sel.select(0)
                if not events:
                    break  # exited and drained; only orphans hold the pipes now
            for key, _ in events:
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                take = min(len(data), limit - total)
                bufs[cast(IO[bytes], key.fileobj)] += data[:take]  # registered above
                total += take
                if take < len(data):
                    return (bytes(bufs[stdout]), bytes(bufs[stderr]),
                            ExecStatus.OUTPUT_LIMIT)
    return bytes(bufs[stdout]), bytes(bufs[stderr]), None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass

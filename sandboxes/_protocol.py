"""The `Sandbox` contract, and `SandboxBase`: async twins and context managers written once."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import numbers
import posixpath
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from agentgym._errors import ConfigError, SandboxError
from agentgym._run_to_end import through_cancels

from ._result import ExecResult

_T = TypeVar("_T")
log = logging.getLogger(__name__)

Files = Mapping[str, "str | bytes"]
LANGUAGES = ("python", "bash", "sh")


@runtime_checkable
class Sandbox(Protocol):
    """Where model-written code runs. Every backend, and a pool's lease, implements these.

    ``run`` executes source code of ``language`` (``"python"``, ``"bash"``, ``"sh"``);
    ``exec`` runs an argv. ``stdin`` (text or bytes) feeds the process's standard input;
    ``files`` maps paths relative to the work directory to contents written before the call;
    ``timeout`` is in seconds (None: the backend's default). ``session`` picks, for Python,
    the sandbox's persistent session (True), a fresh interpreter (False) or the backend's
    default (None); a backend without sessions always runs fresh. ``end_session=True`` ends
    the session first (its threads and every process the code left), so nothing of the code
    runs beside the call: reward verification asks for it, since a thread left in the agent's
    session could otherwise tamper with the test runner's files. Optional, where a backend
    has it (`DockerSandbox`, `LocalSandbox`, a lease of either): ``fresh_workdir=True`` also
    runs the call in an empty work dir and temp dirs, cleaned in the same request, so it sees
    nothing earlier calls left; verification asks for it. Both return an
    `ExecResult` and never raise for anything the code did; only the backend's own failures
    show up, as ``status == "infra_error"``. ``reset`` returns the sandbox to a clean state
    (work dir emptied, every process of the code killed); ``interrupt`` kills the code of
    calls running right now (from another thread; they return soon after); ``close``
    releases it for good.
    """

    def run(self, code: str, language: str = "python", stdin: str | bytes | None = None,
            files: Files | None = None, timeout: float | None = None, *,
            session: bool | None = None, end_session: bool = False) -> ExecResult:
        """Run source code and return its result."""
        ...

    def exec(self, argv: Sequence[str], stdin: str | bytes | None = None,
             files: Files | None = None, timeout: float | None = None) -> ExecResult:
        """Run an argv and return its result."""
        ...

    async def arun(self, code: str, language: str = "python", stdin: str | bytes | None = None,
                   files: Files | None = None, timeout: float | None = None, *,
                   session: bool | None = None, end_session: bool = False) -> ExecResult:
        """Async twin of `run`."""
        ...

    async def aexec(self, argv: Sequence[str], stdin: str | bytes | None = None,
                    files: Files | None = None, timeout: float | None = None) -> ExecResult:
        """Async twin of `exec`."""
        ...

    def reset(self) -> None:
        """Return to a clean state."""
        ...

    async def areset(self) -> None:
        """Async twin of `reset`."""
        ...

    def interrupt(self) -> None:
        """Kill the code of every call running now; safe to call from any thread."""
        ...

    def close(self) -> None:
        """Release every resource; the sandbox cannot be used afterwards."""
        ...


class SandboxBase:
    """Async twins, context managers and argument checks shared by the backends.

    A backend writes the blocking ``run``/``exec``/``reset``/``close``; the async twins run
    them in a worker thread (``asyncio.to_thread``), so there is one implementation.
    """

    async def arun(self, *args: Any, **kwargs: Any) -> ExecResult:
        """Async twin of ``run``; cancelled, it kills its own code and waits for the call."""
        return await cancellable_in_thread(self.run, *args, **kwargs)  # type: ignore[attr-defined]

    async def aexec(self, *args: Any, **kwargs: Any) -> ExecResult:
        """Async twin of ``exec``; cancelled, it kills its own code and waits for the call."""
        return await cancellable_in_thread(self.exec, *args, **kwargs)  # type: ignore[attr-defined]

    async def areset(self) -> None:
        """Async twin of ``reset``."""
        await asyncio.to_thread(self.reset)  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        """Async twin of ``close``."""
        await asyncio.to_thread(self.close)  # type: ignore[attr-defined]

    def __enter__(self) -> Any:
        start = getattr(self, "start", None)
        if start is not None:
            start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # type: ignore[attr-defined]

    async def __aenter__(self) -> Any:
        return await in_thread_to_the_end(self.__enter__, after_cancel=self.close)  # type: ignore[attr-defined]

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class CallToken:
    """One async call's link to the code it runs, so cancelling the await kills that code.

    Why: ``asyncio.to_thread`` cannot stop its thread. A cancelled ``arun`` of a bare
    `DockerSandbox` or `LocalSandbox` left the code running until its own timeout (a
    cancelled ``averify``: 35 s by default), blocked the sandbox's next call that long and
    held ``asyncio.run`` at exit. A backend calls `begin` once the call owns the code's
    process (``kill`` ends exactly that call) and `end` before it lets the next call in.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kill: Callable[[], object] | None = None
        self.cancelled = False

    def begin(self, kill: Callable[[], object]) -> None:
        """Register how to kill this call's code; `SandboxError` if it was cancelled already."""
        with self._lock:
            if self.cancelled:
                raise SandboxError("the call was cancelled before it started; nothing ran")
            self._kill = kill

    def end(self) -> None:
        """The call's code is over: a cancel from now on kills nothing."""
        with self._lock:
            self._kill = None

    def cancel(self) -> None:
        """Kill the call's code if it runs now; refuse it if it has not started.

        Under the lock, so the call cannot end and hand the sandbox to the next call (whose
        code ``kill`` would end) while the kill is under way.
        """
        with self._lock:
            self.cancelled = True
            if self._kill is not None:
                self._kill()


_current = threading.local()


@contextlib.contextmanager
def running_call(kill: Callable[[], object]) -> Iterator[None]:
    """Mark the backend's call on this thread as running (see `CallToken`)."""
    token: CallToken | None = getattr(_current, "token", None)
    if token is None:  # a plain blocking call: nothing can cancel it
        yield
        return
    token.begin(kill)
    try:
        yield
    finally:
        token.end()


async def cancellable_in_thread(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``await asyncio.to_thread(fn, ...)`` whose cancellation kills the call's code.

    Cancelled, it kills what the call runs (`CallToken`), waits for the thread to return
    (even when cancelled again) and re-raises, so no code of a cancelled call runs on.
    """
    token = CallToken()
    linked = linked_to(token, fn)
    return await in_thread_to_the_end(lambda: linked(*args, **kwargs), on_cancel=token.cancel)


def linked_to(token: CallToken, fn: Callable[..., _T]) -> Callable[..., _T]:
    """``fn``, whose sandbox calls on the thread that runs it register with ``token``.

    Why a wrapper: the thread is the link (`running_call` reads it), and the code that starts
    a thread (`cancellable_in_thread`, a threaded reward function's runner) is not the code
    that makes the sandbox call.
    """

    @functools.wraps(fn)
    def linked(*args: Any, **kwargs: Any) -> _T:
        outer = getattr(_current, "token", None)
        _current.token = token
        try:
            return fn(*args, **kwargs)
        finally:
            _current.token = outer

    return linked


def call_cancelled() -> bool:
    """Whether this thread's calls were cancelled (`CallToken`): what came back is no outcome."""
    token: CallToken | None = getattr(_current, "token", None)
    return token is not None and token.cancelled


async def in_thread_to_the_end(
    fn: Callable[[], _T],
    after_cancel: Callable[[], object] | None = None,
    on_cancel: Callable[[], object] | None = None,
) -> _T:
    """``await asyncio.to_thread(fn)`` that, cancelled, lets ``fn`` finish before it re-raises.

    A cancelled thread runs on: a container start or a snapshot restore cancelled midway would
    go on touching the container after the caller let go of it (a restore restarts a container
    the pool has just removed: a leak). So a cancel runs ``on_cancel`` (e.g. killing the
    call's code, so it ends soon), waits for ``fn`` to end, then runs ``after_cancel`` (e.g.
    closing what a cancelled start made), then re-raises. However often it is cancelled
    meanwhile: a second cancel (``asyncio.run`` ending the tasks left, a shutdown) ended that
    wait, and ``after_cancel`` never ran: a pool cancelled twice in its start stayed up.
    A failing ``on_cancel`` or ``after_cancel`` is logged when it fails; the cancel is raised.
    """
    running = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await through_cancels(asyncio.ensure_future(_settle(running, after_cancel, on_cancel)))
        raise


async def _settle(
    running: asyncio.Future[Any],
    after: Callable[[], object] | None,
    first: Callable[[], object] | None,
) -> None:
    if first is not None:
        await _logged_in_thread(first, "on_cancel")
    await asyncio.wait([running])
    if not running.cancelled():
        running.exception()  # retrieved: a call that failed cleaned up after itself
    if after is not None:
        await _logged_in_thread(after, "after_cancel")


async def _logged_in_thread(fn: Callable[[], object], role: str) -> None:
    """Run ``fn`` in a thread; a failure is logged now, naming ``fn``, and not raised.

    Why: raised, it took the place of the caller's cancel (the caller saw that error, not a
    cancellation), and when the caller was cancelled again meanwhile it was dropped unseen.
    """
    try:
        await asyncio.to_thread(fn)
    except Exception:
        name = getattr(fn, "__qualname__", None) or repr(fn)
        log.error("cleaning up a cancelled sandbox call: %s %s failed", role, name,
                  exc_info=True)  # fmt: skip


def to_bytes(data: str | bytes | None) -> bytes | None:
    """Text as UTF-8 bytes; bytes and None unchanged."""
    return data.encode("utf-8") if isinstance(data, str) else data


def language_argv(language: str, code: str) -> list[str] | None:
    """The argv that runs ``code`` for a shell language; None for Python (run in-process)."""
    if language not in LANGUAGES:
        raise ConfigError(f"language must be one of {LANGUAGES}, got {language!r}")
    return None if language == "python" else [language, "-c", code]


MAX_TIMEOUT_S = 7 * 86400.0  # a week: past that, the platform's clocks overflow (inf did)


def check_timeout(timeout: Any, what: str = "timeout", most: float = MAX_TIMEOUT_S) -> float:
    """``timeout`` as seconds; `ConfigError` unless it is a number in (0, most].

    Why: nan or inf reached the server and came back as an ``infra_error`` (the caller's
    mistake scored as the sandbox's), a negative one as the code's ``timeout``. ``most`` is
    lower where a caller adds time of its own (verify's runner slack), so the error names
    the caller's own argument and limit.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not (
            0 < float(timeout) <= most):
        raise ConfigError(f"{what} must be a number of seconds > 0 and <= {most:g}, "
                          f"got {timeout!r}")
    return float(timeout)


def check_call_args(what: str, code: Any, stdin: Any, files: Any) -> None:
    """`ConfigError` for a call's arguments of the wrong type, before anything runs.

    Why: code that is not text came back from the container as an ``infra_error`` (the
    caller's mistake scored as the sandbox's, and the sandbox recycled); an argv given as one
    string ran its first letter; ``stdin`` or a file's content that is not text or bytes
    raised a bare ``TypeError``. Text that cannot be UTF-8 (a lone surrogate) raised a bare
    ``UnicodeEncodeError`` on both backends. (argv items that are not strings, a `Path`, a
    number, run as their ``str`` on both.)
    """
    if what == "code" and not isinstance(code, str):
        raise ConfigError(f"code must be a str (the source to run), got {type(code).__name__}")
    if what == "argv":
        if isinstance(code, (str, bytes)) or not isinstance(code, Sequence) or not code:
            raise ConfigError(f"argv must be a non-empty list of strings such as ['ls', '-la'], "
                              f"got {code!r:.80}")
    if stdin is not None and not isinstance(stdin, (str, bytes)):
        raise ConfigError(f"stdin must be str, bytes or None, got {type(stdin).__name__}")
    _check_utf8("stdin", stdin)
    if files is not None:
        if not isinstance(files, Mapping):
            raise ConfigError(f"files must map relative paths to str or bytes, got "
                              f"{type(files).__name__}")
        for path, content in files.items():
            if not isinstance(path, str) or not isinstance(content, (str, bytes)):
                raise ConfigError(f"files[{path!r}] must be str or bytes under a str path, got "
                                  f"{type(content).__name__}")
            _check_utf8(f"files[{path!r:.60}]", content)


def _check_utf8(what: str, data: str | bytes | None) -> None:
    """`ConfigError` for text that has no UTF-8 form (a lone surrogate, e.g. U+DCFF)."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"{what} is not valid Unicode text ({exc.reason} at position "
                              f"{exc.start}); pass bytes for binary data") from None


def check_relative(path: str) -> None:
    """Raise `ConfigError` unless ``path`` names a file inside the work directory."""
    norm = posixpath.normpath(path)
    if posixpath.isabs(path) or norm == ".." or norm.startswith("../") or norm == ".":
        raise ConfigError(f"file path {path!r} leaves the work directory; use a relative path "
                          "such as 'src/main.py'")

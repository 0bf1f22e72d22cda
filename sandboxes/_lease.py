"""`SandboxLease`: one holder's use of a sandbox, which ends before the sandbox moves on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from agentgym._errors import SandboxError

from ._protocol import Files, Sandbox, SandboxBase
from ._result import ExecResult

INTERRUPT_AGAIN_S = 0.5
"""How often an ending lease interrupts its calls again while some are still running."""


class SandboxLease(SandboxBase):
    """A sandbox as one episode sees it; a `Sandbox` whose calls stop when the lease ends.

    Why a handle and not the sandbox itself: when an episode is cancelled, a tool call of it
    may still be running, or about to start in a worker thread. Ending the lease refuses every
    later call (`SandboxError`), kills the code of the calls still running
    (`Sandbox.interrupt`), waits for them to return, and only then hands the sandbox back. So
    no code of one episode runs once its lease has returned, let alone in the next episode's
    sandbox. Attributes other than the `Sandbox` methods (``container_id``, ``snapshot`` ...)
    are the sandbox's own.
    """

    def __init__(self, sandbox: Sandbox, give_back: Callable[[bool], None]) -> None:
        self.sandbox = sandbox
        self._give_back = give_back  # called once, with True when the sandbox must be replaced
        self._cond = threading.Condition()
        self._running = 0
        self._ended = False

    def __getattr__(self, name: str) -> Any:
        if name == "sandbox":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.sandbox, name)

    # -- the Sandbox protocol ---------------------------------------------------------------
    def run(self, code: str, language: str = "python", stdin: str | bytes | None = None,
            files: Files | None = None, timeout: float | None = None, *,
            session: bool | None = None, end_session: bool = False,
            fresh_workdir: bool = False) -> ExecResult:
        """The sandbox's ``run``, while the lease lasts.

        ``fresh_workdir=True`` is passed on to the sandbox (only when set: not every backend
        has it; `DockerSandbox` and `LocalSandbox` do, see `Sandbox`).
        """
        options = {"fresh_workdir": True} if fresh_workdir else {}
        return self._call(self.sandbox.run, code, language, stdin, files, timeout,
                          session=session, end_session=end_session, **options)

    def exec(self, argv: Sequence[str], stdin: str | bytes | None = None,
             files: Files | None = None, timeout: float | None = None) -> ExecResult:
        """The sandbox's ``exec``, while the lease lasts."""
        return self._call(self.sandbox.exec, argv, stdin, files, timeout)

    def reset(self, **options: Any) -> None:
        """The sandbox's ``reset`` and its options (``hard=True``), while the lease lasts."""
        self._call(self.sandbox.reset, **options)

    def interrupt(self) -> None:
        """Kill the code of the calls running now; the lease goes on.

        Once the lease has ended it does nothing: its own calls were killed by `end`, and the
        sandbox may already run the next holder's code, which this must not kill.
        """
        with self._cond:
            if self._ended:
                return
        self.sandbox.interrupt()

    # -- state fork: the sandbox's, gated like the calls ------------------------------------
    def snapshot(self, *args: Any, **kwargs: Any) -> Any:
        """The sandbox's ``snapshot``, while the lease lasts (after it: the next holder's files)."""
        return self._call(self.sandbox.snapshot, *args, **kwargs)  # type: ignore[attr-defined]

    def restore(self, *args: Any, **kwargs: Any) -> None:
        """The sandbox's ``restore``, while the lease lasts (after it: the next holder's files)."""
        self._call(self.sandbox.restore, *args, **kwargs)  # type: ignore[attr-defined]

    def close(self) -> None:
        """End the lease (see `end`)."""
        self.end()

    # -- ending -----------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        """True once `end` was called."""
        return self._ended

    def end(self, failed: bool = False) -> None:
        """Refuse new calls, kill and await running ones, then give the sandbox back.

        ``failed`` asks for the sandbox to be replaced rather than reset; a lease that had to
        kill a running call asks for that too. Idempotent; blocks while calls wind down.
        """
        busy = self._close_gate()
        if busy is not None:
            self._finish(busy, failed)

    async def aend(self, failed: bool = False) -> None:
        """Async twin of `end`; without running calls it returns at once.

        The wait for running calls happens in a thread that gives the sandbox back even when
        this await is cancelled, so a lease always returns (only later).
        """
        busy = self._close_gate()
        if busy is None:
            return
        if not busy:
            self._finish(False, failed)
            return
        await asyncio.shield(asyncio.to_thread(self._finish, True, failed))

    def _close_gate(self) -> bool | None:
        """End the lease; True when calls are running, None when it had ended already."""
        with self._cond:
            if self._ended:
                return None
            self._ended = True
            return self._running > 0

    def _finish(self, busy: bool, failed: bool) -> None:
        if busy:
            # Again until none is left: `interrupt` kills only a call that runs in the sandbox
            # now, and one of ours may have passed the gate but not yet reached the sandbox.
            while True:
                self.sandbox.interrupt()
                with self._cond:
                    if self._cond.wait_for(lambda: self._running == 0, INTERRUPT_AGAIN_S):
                        break
        self._give_back(failed or busy)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._cond:
            if self._ended:
                raise SandboxError("this sandbox lease has ended (its episode is over or was "
                                   "cancelled); nothing ran")
            self._running += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

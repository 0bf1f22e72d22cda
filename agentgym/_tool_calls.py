"""How a tool call runs: under its timeout, cancellable, and never hanging its episode.

Async tools run in the caller's task (`run_coroutine`, stepped by `_Resume`); sync tools on
the process's warm worker threads (`run_in_thread`), at most `ToolThreads.size` of one env at
once. Either way, when the call times out or its episode is cancelled the episode goes on:
an async tool is cancelled and, if it will not stop, closed after `CANCEL_GRACE_SECONDS`; a
sync tool's thread is abandoned (a thread cannot be killed) and its late result dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import queue
import threading
import time
import types
import typing
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Iterable
from typing import Any

from ._errors import ConfigError, ToolTimeoutError
from ._warn_once import warn_once

#: Seconds a cancelled async tool may go on waiting (its cleanup) before it is closed.
CANCEL_GRACE_SECONDS = 1.0
#: An async tool step that holds the event loop this long is called blocking (asyncio's debug
#: mode calls a callback slow from 0.1 s: every other episode waits that long).
BLOCKING_STEP_SECONDS = 0.1

log = logging.getLogger(__name__)
#: What calling an ``async def`` function returns.
_COROUTINE = types.CoroutineType


async def run_coroutine(
    fn: Callable[..., Any], kwargs: dict[str, Any], name: str, timeout: float | None
) -> Any:
    """Run the async tool ``fn`` in the caller's task, under ``timeout`` counted from the call.

    The tool runs in a context of its own, as a task of its own would, but without one:
    most tool calls finish without ever waiting, and those pay neither a task nor a timer
    (each costs more than the rest of an env step). Only a call that suspends is timed by
    a timer of `_Resume`, with the deadline the call had from its start. When the timeout
    fires or the caller is cancelled, the tool sees `asyncio.CancelledError` where it
    waits, and its cleanup has run when this returns, unless it takes longer than
    `CANCEL_GRACE_SECONDS`: then the tool is closed where it waits (`_Resume`), so a tool
    that ignores cancellation cannot hang its episode. A call that ends past its timeout
    without the timer cutting it (it blocked the event loop, so the timer could not run)
    is timed out all the same: the timeout is the tool's contract. A `TimeoutError` the
    tool raises itself stays the tool's error, not a timeout.
    """
    # The process's clock, not the loop's: a loop may read its clock once per iteration
    # (uvloop does), which would hide exactly the time a blocking tool holds the loop.
    clock = time.monotonic
    start = clock()
    context = contextvars.copy_context()
    coro = fn(**kwargs)
    if type(coro) is not _COROUTINE:  # an `async def`'s coroutine, the usual call, goes on
        if not inspect.isawaitable(coro):  # a wrapper of an async function that ran it itself
            return coro
        if not inspect.iscoroutine(coro):  # a Task or Future a wrapper returned: timed too
            try:
                return await asyncio.wait_for(coro, timeout)
            except TimeoutError:
                raise _timed_out(name, timeout, 0.0) from None
    try:
        signal = context.run(coro.send, None)
    except StopIteration as finished:  # the usual call: its one extra cost is a clock read
        if timeout is not None and clock() - start > timeout:
            raise _timed_out(name, timeout, clock() - start) from None  # it blocked the loop
        return finished.value
    resume = _Resume(coro, signal, context, name, clock() - start)
    if timeout is None:
        return await resume
    loop = asyncio.get_running_loop()
    timer = loop.call_later(timeout - resume.longest, resume.time_out)
    try:
        result = await resume
    except asyncio.CancelledError:
        if resume.withdraw_timeout():
            raise _timed_out(name, timeout, resume.longest, cut=True) from None
        raise
    finally:
        timer.cancel()
    if clock() - start > timeout:  # it blocked the loop past its deadline: the timer
        raise _timed_out(name, timeout, resume.longest)  # never got to run
    return result


async def run_in_thread(
    fn: Callable[..., Any], kwargs: dict[str, Any], name: str, timeout: float | None
) -> Any:
    """Run the sync tool ``fn`` on a worker thread and wait up to ``timeout`` for its result.

    The call's future is this call's own, so the timer settles it with a marker instead
    of cancelling anything: a cancellation that reaches here is always the caller's.
    Whenever this stops waiting the future is done, and the thread's late result is
    dropped (`_settle`).
    """
    running = _start_thread(fn, kwargs)
    timer = None
    if timeout is not None:
        timer = running.get_loop().call_later(timeout, _expire, running)
    try:
        result = await running
    finally:
        if timer is not None:
            timer.cancel()
    if result is _TIMED_OUT:
        raise _timed_out(name, timeout, 0.0)  # a thread never blocks the loop
    return result


def _timed_out(
    name: str, timeout: float | None, blocked: float, cut: bool = False
) -> ToolTimeoutError:
    """The call's timeout error; ``blocked``: the longest the tool held the event loop.

    A tool that blocks the loop (``time.sleep`` in an ``async def``) cannot be cancelled
    while it does, and holds up every other episode: the model's message and one warning
    per tool say so, with the fix, since the timeout alone would not tell why. ``cut``:
    the timer cut the call, so a block under half the timeout is not named (it did not
    make the call late; a slow service did).
    """
    message = f"{name!r} timed out after {timeout:g} s"
    least = max(BLOCKING_STEP_SECONDS, (timeout or 0.0) / 2 if cut else 0.0)
    if blocked < least:
        return ToolTimeoutError(message)
    warn_once(
        log, "blocked", name,
        "async tool %r blocked the event loop for %.1f s in one go (timeout %g s): every "
        "episode waited, and its timeout could not interrupt it; make it a plain `def` "
        "(it then runs on a thread) or await instead of blocking",
        name, blocked, timeout,
    )  # fmt: skip
    return ToolTimeoutError(
        f"{message}: it blocked the event loop for {blocked:.1f} s; an async tool must "
        "await instead of blocking, or be a plain `def` (which runs on a thread)"
    )


class _Resume:
    """Awaiting this runs the rest of ``coro``, which has already run up to yielding ``signal``.

    Each step of ``coro`` runs in ``context``. What the awaiting task sends or throws (a
    result, `asyncio.CancelledError`) goes on to ``coro``, as ``await coro`` would have done,
    and ``longest`` keeps the longest step (how long the tool held the event loop in one go;
    ``first``: its first step's).

    A cancellation of the call (its timeout, or the caller's) holds whatever the tool does
    with it. A tool that returns or raises while one is pending raises it. One that goes on
    waiting (its cleanup awaits, or it swallows cancellations) gets `CANCEL_GRACE_SECONDS`;
    then it is closed where it waits (``coro.close()``: its ``finally`` blocks run) and the
    call ends, so it cannot hang its episode. Cancellations the tool asks for itself, on its
    own task (``asyncio.timeout``, a TaskGroup, anyio's cancel scopes inside httpx), are its
    own business: they are withdrawn (``Task.uncancel``) by the time they are handled, so
    only requests still counted by ``Task.cancelling`` above ``base``, the count the call
    started with, are the call's. None of this costs a step until something is thrown into
    the tool. `time_out` is the call's own timer (`run_coroutine`): it cancels the
    call's task, as `asyncio.timeout` would, without its context manager's cost.
    """

    __slots__ = ("coro", "signal", "context", "name", "longest", "task", "base", "grace",
                 "timed_out")  # fmt: skip

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any],
        signal: Any,
        context: contextvars.Context,
        name: str,
        first: float,
    ) -> None:
        self.coro, self.signal, self.context, self.name = coro, signal, context, name
        self.longest = first
        self.task = asyncio.current_task()
        self.base = 0 if self.task is None else self.task.cancelling()
        self.grace: asyncio.TimerHandle | _Spent | None = None  # `_OVERDUE` once it is over
        self.timed_out = False

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, signal, run, clock = self.coro, self.signal, self.context.run, time.monotonic
        longest, watch = self.longest, False
        try:
            while True:
                try:
                    sent = yield signal
                except GeneratorExit:
                    coro.close()
                    raise
                except BaseException as exc:  # cancellation, delivered where the tool waits
                    if self.grace is _OVERDUE:
                        self._close(exc)
                    step: Callable[[Any], Any] = coro.throw
                    sent, watch = exc, True
                else:
                    step = coro.send
                began = clock()
                try:
                    signal = run(step, sent)
                except StopIteration as finished:
                    if watch and self._pending():  # it returned from the call's cancellation
                        raise asyncio.CancelledError(f"{self.name!r} was cancelled") from None
                    return finished.value
                except Exception as error:
                    if watch and self._pending():
                        raise asyncio.CancelledError(f"{self.name!r} was cancelled") from error
                    raise
                finally:
                    took = clock() - began
                    if took > longest:
                        longest = took
                if watch:
                    watch = self._keep_watching()
        finally:
            self.longest = longest
            if self.grace is not None:
                self.grace.cancel()

    def time_out(self) -> None:
        """The call's timer: cancel the call (`withdraw_timeout` tells it apart)."""
        if self.task is not None:
            self.timed_out = True
            self.task.cancel()

    def withdraw_timeout(self) -> bool:
        """Withdraw `time_out`'s request, if it made one; whether it alone ended the call.

        As `asyncio.timeout` does: when the caller was cancelled too, its cancellation goes on.
        """
        if not self.timed_out or self.task is None:
            return False
        return self.task.uncancel() <= self.base

    def _pending(self) -> bool:
        """Whether a cancellation of the call (not one the tool asked for) is pending."""
        return self.task is not None and self.task.cancelling() > self.base

    def _keep_watching(self) -> bool:
        """After the tool went on from a cancellation: time its grace while one is pending."""
        if self._pending():
            if self.grace is None:
                loop = asyncio.get_running_loop()
                self.grace = loop.call_later(CANCEL_GRACE_SECONDS, self._end_grace)
            return True
        if self.grace is not None:  # its own cancellation, handled: nothing to time
            self.grace.cancel()
            self.grace = None
        return False

    def _end_grace(self) -> None:
        """The grace is over: wake the call's task, to close the tool (`_close`)."""
        if self.task is not None:
            self.grace = _OVERDUE
            self.task.cancel()

    def _close(self, wake_up: BaseException) -> typing.NoReturn:
        """Close the tool where it waits, and end the call with the cancellation it ignored."""
        assert self.task is not None  # only a task's call is woken up
        self.task.uncancel()  # the wake-up's own request; the call's are still counted
        try:
            self.coro.close()
        except Exception:  # its cleanup awaited ("coroutine ignored GeneratorExit") or failed:
            pass  # the call ends cancelled all the same, or its task's count would be off
        warn_once(
            log, "closed", self.name,
            "async tool %r was still running %g s after it was cancelled (it swallows "
            "asyncio.CancelledError, or its cleanup waits that long), so it was closed where "
            "it waited and its episode went on. Let CancelledError propagate out of async "
            "tools, and keep cleanup short", self.name, CANCEL_GRACE_SECONDS,
        )  # fmt: skip
        raise wake_up


class _Spent:
    """What `_Resume.grace` holds once a cancelled tool's grace is over: a timer that ran."""

    def cancel(self) -> None:
        """Nothing left to cancel."""


_OVERDUE = _Spent()


_TIMED_OUT = object()  # what the timer settles a sync call's future with


class CallExit(Exception):
    """A call's own `SystemExit`, `StopIteration` (and the like), carried as its failure.

    ``raised`` is the original (also the cause): `SystemExit`, `GeneratorExit`,
    `StopIteration`, a `CancelledError` nobody asked for, or on a worker thread a
    `KeyboardInterrupt` (no signal arrives there). Each, left as itself, ended more than the
    call: argparse exits on arguments it refuses, so a model's arguments could make a tool end
    the whole rollout; `StopIteration` (``next`` on an iterator with nothing left) cannot be
    delivered through a future, so a sync tool's caller waited out its timeout and a threaded
    reward function's forever; a `CancelledError` nobody asked for read as the episode's
    cancellation.
    """

    def __init__(self, raised: BaseException) -> None:
        super().__init__(str(raised))
        self.raised = raised
        self.__cause__ = raised


def call_failure(exc: BaseException, cancellations: int) -> Exception | None:
    """``exc``, raised by a call made on the event loop, as the call's own failure, or None.

    None when it ends more than the call: Ctrl-C (`KeyboardInterrupt`), or a cancellation
    asked for (its task's count of pending cancellations is above ``cancellations``, the count
    when the call began). A `CancelledError` with none pending is the called code's own.
    """
    if isinstance(exc, Exception) and not isinstance(exc, StopIteration):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return None
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        if task is None or task.cancelling() > cancellations:
            return None
    return CallExit(exc)


def cancellations() -> int:
    """The running task's count of pending cancellations (`call_failure`'s baseline)."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def original(exc: BaseException) -> BaseException:
    """What the call raised: a `CallExit`'s original, or ``exc``."""
    return exc.raised if isinstance(exc, CallExit) else exc


def describe_failure(exc: BaseException) -> str:
    """``ValueError: bad input``: the type and text of what a call raised.

    An exception whose ``__str__`` itself raises (a client library's error reading a field
    the response lacks) is named by its type: formatting it crashed the step.
    """
    raised = original(exc)
    try:
        text = str(raised)
    except Exception:
        text = "(its message could not be printed: its __str__ raised)"
    return f"{type(raised).__name__}: {text}"


def _expire(running: asyncio.Future[Any]) -> None:
    if not running.done():
        running.set_result(_TIMED_OUT)


class ToolThreads:
    """A cap on the sync tool calls of one owner (an env) that run at once.

    An env owns one, so a busy process never makes one episode's calls wait for another's, and
    waiting for a free slot is not part of a call's timeout. Each call runs on a thread of its
    own, taken warm from the process's idle worker threads or started when none is idle.
    A call whose caller stops waiting (timeout or cancellation) gives its slot back at once;
    its thread cannot be killed and finishes unobserved (see `tool`). Slots are handed over
    with thread-safe callbacks, so one instance serves callers on any event loop.
    """

    def __init__(self, size: int = 8) -> None:
        if size < 1:
            raise ConfigError(f"ToolThreads size must be >= 1, got {size}")
        self.size = size
        self._lock = threading.Lock()
        self._free = size
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        """Take a slot, waiting for one when all ``size`` are held; pair with `release`."""
        with self._lock:
            if self._free:
                self._free -= 1
                return
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            with self._lock:
                if turn in self._waiting:
                    self._waiting.remove(turn)
                    raise
            if not turn.cancelled():  # handed a slot just as the caller gave up: pass it on
                self.release()
            raise  # a cancelled hand-over is passed on by _hand_over

    def release(self) -> None:
        """Give a slot back: to the longest waiting caller, or to the free ones."""
        with self._lock:
            while self._waiting:
                turn = self._waiting.popleft()
                with contextlib.suppress(RuntimeError):  # its loop closed: try the next
                    turn.get_loop().call_soon_threadsafe(self._hand_over, turn)
                    return
            self._free += 1

    def _hand_over(self, turn: asyncio.Future[None]) -> None:
        if turn.cancelled():
            self.release()
        else:
            turn.set_result(None)


#: Seconds an idle worker thread waits for its next call before it exits.
IDLE_THREAD_SECONDS = 30.0

_Job = tuple[Callable[..., Any], dict[str, Any], contextvars.Context, asyncio.AbstractEventLoop,
             "asyncio.Future[Any]"]  # fmt: skip


class _Workers:
    """The process's idle worker threads, each waiting on its own inbox (newest last)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[queue.SimpleQueue[_Job]] = []


_workers = _Workers()
if hasattr(os, "register_at_fork"):  # a forked child has none of the parent's threads

    def _forget_workers() -> None:
        global _workers
        _workers = _Workers()

    os.register_at_fork(after_in_child=_forget_workers)


def _start_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
    """Run ``fn`` on an idle worker thread (a new one when none is idle).

    The future settles on the caller's loop. Workers are daemon threads: one running an
    abandoned call neither holds `asyncio.run` (they are not the loop's default executor) nor
    the interpreter at exit, so such a call cannot hang `rollout` or the CLI. Reusing warm
    threads takes a thread start off every sync call; idle ones exit after
    `IDLE_THREAD_SECONDS`.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    job: _Job = (fn, kwargs, contextvars.copy_context(), loop, future)
    workers = _workers
    with workers.lock:
        inbox = workers.idle.pop() if workers.idle else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        args = (workers, inbox)
        threading.Thread(target=_serve, args=args, name="agentgym-tool", daemon=True).start()
    inbox.put(job)
    return future


def _serve(workers: _Workers, inbox: queue.SimpleQueue[_Job]) -> None:
    """A worker thread: run the calls put in ``inbox``; exit after idling too long."""
    while True:
        try:
            job = inbox.get(timeout=IDLE_THREAD_SECONDS)
        except queue.Empty:
            with workers.lock:
                idle = inbox in workers.idle
                if idle:
                    workers.idle.remove(inbox)
            if idle:
                return
            job = inbox.get()  # handed a call just as the wait ended: run it
        fn, kwargs, context, loop, future = job
        del job
        threading.current_thread().name = f"agentgym-tool-{getattr(fn, '__name__', 'fn')}"
        try:
            outcome: tuple[Any, BaseException | None] = (context.run(fn, **kwargs), None)
        except BaseException as exc:  # delivered to the caller like to_thread does, but on a
            # worker no signal or cancellation arrives: whatever fn raised is its failure
            plain = isinstance(exc, Exception) and not isinstance(exc, StopIteration)
            outcome = (None, exc if plain else CallExit(exc))
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, future, *outcome)
        del fn, kwargs, context, loop, future, outcome  # an idle thread holds no call's data
        with workers.lock:
            workers.idle.append(inbox)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # abandoned: the caller timed out or was cancelled
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


async def cancel_and_wait(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel what is still running and wait until it has stopped, outcomes discarded.

    Waiting is what makes cancellation complete: a tool's cleanup (``finally``, releasing a
    sandbox) has run when this returns, not at some later point of the loop.
    """
    futures = list(futures)
    pending = {f for f in futures if not f.done()}
    for future in pending:
        future.cancel()
    if pending:
        await asyncio.wait(pending)
    for future in futures:  # those that had ended before too: nobody else reads them
        if not future.cancelled():
            future.exception()  # retrieved: no "exception was never retrieved" warning

"""The event loop that sync code runs its async work on: `rollout`, ``agentgym eval``, `train`.

`asyncio.run` and a plain `asyncio.Runner` spoil the end of such a run three ways; `own_loop`
and `run_caught` end it instead:

- A KeyboardInterrupt (Ctrl-C landing in env code) or SystemExit raised in a task is raised
  out of the loop and also kept on the task. Raised in an episode's task, it stops the loop
  with the main task still waiting; the next run on that loop (the trainer's close of its
  envs) resumed that task, which raised it again: the close was cut short, envs left open,
  and the main task's copy, which nobody reads, printed "Task exception was never
  retrieved", with a traceback, after the user's Ctrl-C. `run_caught` hands it out of the
  main task as a value and raises it itself.
- Their close waits for every task left, without a limit: one that ignores cancellation (a
  tool's or an env's, left behind by its episode) hung the caller after its work was done.
  `own_loop` waits `CANCEL_GRACE_SECONDS`, then leaves them, named in a warning.
- Their close waits for every thread of the loop's default executor, without a limit on
  Python 3.11 (300 s from 3.12): an env's close left open after ``close_timeout`` still
  waited in ``asyncio.to_thread`` (a Docker call to a daemon that stopped answering), and
  `rollout` and `train` did not return. `own_loop` waits as long for those threads, then
  leaves them, named in a warning. They are daemon threads (`_DaemonThreads`), abandoned
  when the interpreter exits: a `ThreadPoolExecutor`'s are joined at exit, and
  ``agentgym eval`` and ``agentgym train`` returned but never ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from ._tool_calls import CANCEL_GRACE_SECONDS

_T = TypeVar("_T")
_P = ParamSpec("_P")

log = logging.getLogger(__name__)

#: Numbers each loop's executor threads apart, so a warning names only its own loop's threads.
_loop_numbers = itertools.count(1)


@dataclass(frozen=True)
class _Interrupted:
    """A KeyboardInterrupt or SystemExit the main task ended with, handed out as its value."""

    error: KeyboardInterrupt | SystemExit


async def _caught(main: Coroutine[Any, Any, _T]) -> _T | _Interrupted:
    """``await main``, with a KeyboardInterrupt or SystemExit returned instead of raised.

    Why: raised, asyncio keeps it on the task as well as raising it out of the loop, and
    reports the task's copy, unread, as "Task exception was never retrieved".
    """
    try:
        return await main
    except (KeyboardInterrupt, SystemExit) as exc:
        return _Interrupted(exc)


def run_caught(runner: asyncio.Runner, main: Coroutine[Any, Any, _T]) -> _T:
    """``runner.run(main)``, leaving no KeyboardInterrupt or SystemExit on its task (`_caught`).

    Either is raised here all the same, with its traceback from where it was raised.
    """
    outcome = runner.run(_caught(main))
    if isinstance(outcome, _Interrupted):
        raise outcome.error
    return outcome


async def settle(close_timeout: float) -> None:
    """Wait for the loop's other tasks to end, none cancelled, as long as an episode's end takes.

    That is `CANCEL_GRACE_SECONDS` for its tool calls to end, then ``close_timeout`` for its
    env's close.

    Why: a KeyboardInterrupt or SystemExit raised in one of a run's tasks stops the loop while
    the others still run, the run's main task among them; run on, it sees the exit and
    cancels its episodes, which close their envs, each within its ``close_timeout``. Closed
    at once instead, the loop gave those closes `CANCEL_GRACE_SECONDS` (`_end_leftovers`):
    a slower one was cut, its env left open.
    """
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others, timeout=CANCEL_GRACE_SECONDS + close_timeout)


@contextlib.contextmanager
def own_loop(who: str) -> Iterator[asyncio.Runner]:
    """A new event loop for ``who`` (what warnings call its caller), closed within a bound.

    On exit the tasks left are cancelled, then given `CANCEL_GRACE_SECONDS` to end, and the
    threads of its default executor (``asyncio.to_thread``) as long again; what still runs
    then is left behind, named in one warning each (`_end_leftovers`, `_end_threads`).
    """
    loop = asyncio.new_event_loop()
    executor = _DaemonThreads(f"agentgym-loop-{next(_loop_numbers)}")
    loop.set_default_executor(executor)
    asyncio.set_event_loop(loop)
    try:
        yield asyncio.Runner(loop_factory=lambda: loop)
    finally:
        try:
            _end_leftovers(loop, who)
            loop.run_until_complete(loop.shutdown_asyncgens())
            _end_threads(executor, who)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _end_leftovers(loop: asyncio.AbstractEventLoop, who: str) -> None:
    """Cancel the tasks left on ``loop``, and wait `CANCEL_GRACE_SECONDS` for them to end.

    Those still running then are left with the closed loop, named in one warning: they
    ignore cancellation, and waiting longer would only hang the caller.
    """
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if not left:
        return
    _, stuck = loop.run_until_complete(asyncio.wait(left, timeout=CANCEL_GRACE_SECONDS))
    for task in left - stuck:  # what asyncio.run reports for the tasks it cancels
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler({
                "message": f"unhandled exception in a task cancelled as {who} returned",
                "exception": task.exception(), "task": task,
            })  # fmt: skip
    if stuck:
        names = sorted({_task_label(task) for task in stuck})
        log.warning(
            "%s: %d task(s) still ran %g s after being cancelled as it returned, and were "
            "left behind when its event loop closed: %s. Code run on the event loop must let "
            "asyncio.CancelledError propagate",
            who, len(stuck), CANCEL_GRACE_SECONDS, ", ".join(names),
        )  # fmt: skip
        for task in stuck:  # warned above; no "Task was destroyed but it is pending!"
            task._log_destroy_pending = False  # type: ignore[attr-defined]


def _task_label(task: asyncio.Task[Any]) -> str:
    """What the warning calls a task: its name, and the coroutine it runs (the code to fix)."""
    coro = task.get_coro()
    return f"{task.get_name()} ({getattr(coro, '__qualname__', type(coro).__name__)})"


def _end_threads(executor: _DaemonThreads, who: str) -> None:
    """Shut ``executor`` down, waiting `CANCEL_GRACE_SECONDS` for its threads to end.

    Those still running then are left running, named in one warning: a thread cannot be
    stopped, and what it waits for (a daemon that stopped answering) may never come; being
    daemon threads, they do not hold the interpreter's exit either. The
    wait runs in a helper thread so that it can end at the grace; `Thread.join` with a
    timeout would do too, but a Ctrl-C during it makes the thread look ended (bpo-45274).
    """
    shut = threading.Event()

    def shut_down() -> None:
        executor.shutdown(wait=True)
        shut.set()

    threading.Thread(target=shut_down, name=f"{executor.prefix}-shutdown", daemon=True).start()
    if shut.wait(CANCEL_GRACE_SECONDS):
        return
    names = sorted(t.name for t in executor.threads if t.is_alive())
    log.warning(
        "%s: %d thread(s) of its event loop (asyncio.to_thread, run_in_executor) still ran "
        "%g s after it returned: %s. A thread cannot be stopped: they are left running, and "
        "abandoned when the interpreter exits",
        who, len(names), CANCEL_GRACE_SECONDS, ", ".join(names),
    )  # fmt: skip


#: What a `ThreadPoolExecutor` made without ``max_workers`` allows, and so asyncio's default.
_MAX_THREADS = min(32, (os.cpu_count() or 1) + 4)


class _DaemonThreads(ThreadPoolExecutor):
    """A loop's default executor whose threads are daemon threads, not joined at exit.

    Why: at exit the interpreter joins every `ThreadPoolExecutor`'s threads, so one stuck
    for good (an env's close waiting on a Docker daemon that stopped answering) kept the
    process alive after `rollout` or `train` had returned and warned of it (`_end_threads`).
    Otherwise it runs work as asyncio's default executor does: up to `_MAX_THREADS` threads,
    made as work arrives and no thread is idle; more work queues. A subclass only because
    ``loop.set_default_executor`` takes nothing else: none of the base's state is used.
    """

    def __init__(self, prefix: str) -> None:
        super().__init__(max_workers=_MAX_THREADS, thread_name_prefix=prefix)
        self.prefix = prefix
        self.threads: list[threading.Thread] = []
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one count per thread waiting for work
        self._closed = False
        self._guard = threading.Lock()

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        """Queue ``fn(*args, **kwargs)``; a thread is made for it if none is idle and few run."""
        future: Future[_T] = Future()
        with self._guard:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.put(_Job(future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self.threads) < _MAX_THREADS:
                thread = threading.Thread(target=_serve, args=(self._jobs, self._idle),
                                          name=f"{self.prefix}_{len(self.threads)}", daemon=True)
                thread.start()
                self.threads.append(thread)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; the threads end once the queued work is done (``wait``: wait)."""
        with self._guard:
            self._closed = True
            while cancel_futures:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job.future.cancel()
            self._jobs.put(None)  # each thread passes it on as it ends
        if wait:
            for thread in self.threads:
                thread.join()


@dataclass(frozen=True)
class _Job:
    """A call queued on `_DaemonThreads`, and the future that gets its outcome."""

    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _serve(jobs: queue.SimpleQueue[_Job | None], idle: threading.Semaphore) -> None:
    """A `_DaemonThreads` thread: run queued jobs until the executor is shut down (a None)."""
    while (job := jobs.get()) is not None:
        if job.future.set_running_or_notify_cancel():
            try:
                job.future.set_result(job.fn(*job.args, **job.kwargs))
            except BaseException as exc:  # the caller's to handle, as any executor hands it
                job.future.set_exception(exc)
        del job  # its arguments and result are not kept alive while the thread waits
        idle.release()
    jobs.put(None)

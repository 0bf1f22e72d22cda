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
  leaves them, named in a warning; the interpreter still waits for them before it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from ._tool_calls import CANCEL_GRACE_SECONDS

_T = TypeVar("_T")

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


@contextlib.contextmanager
def own_loop(who: str) -> Iterator[asyncio.Runner]:
    """A new event loop for ``who`` (what warnings call its caller), closed within a bound.

    On exit the tasks left are cancelled, then given `CANCEL_GRACE_SECONDS` to end, and the
    threads of its default executor (``asyncio.to_thread``) as long again; what still runs
    then is left behind, named in one warning each (`_end_leftovers`, `_end_threads`).
    """
    loop = asyncio.new_event_loop()
    prefix = f"agentgym-loop-{next(_loop_numbers)}"
    executor = ThreadPoolExecutor(thread_name_prefix=prefix)  # its threads, to name them
    loop.set_default_executor(executor)
    asyncio.set_event_loop(loop)
    try:
        yield asyncio.Runner(loop_factory=lambda: loop)
    finally:
        try:
            _end_leftovers(loop, who)
            loop.run_until_complete(loop.shutdown_asyncgens())
            _end_threads(executor, prefix, who)
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


def _end_threads(executor: ThreadPoolExecutor, prefix: str, who: str) -> None:
    """Shut ``executor`` down, waiting `CANCEL_GRACE_SECONDS` for its threads to end.

    Those still running then are left running, named in one warning: a thread cannot be
    stopped, and what it waits for (a daemon that stopped answering) may never come. The
    wait runs in a helper thread so that it can end at the grace; `Thread.join` with a
    timeout would do too, but a Ctrl-C during it makes the thread look ended (bpo-45274).
    """
    shut = threading.Event()

    def shut_down() -> None:
        executor.shutdown(wait=True)
        shut.set()

    threading.Thread(target=shut_down, name=f"{prefix}-shutdown", daemon=True).start()
    if shut.wait(CANCEL_GRACE_SECONDS):
        return
    names = sorted(t.name for t in threading.enumerate() if t.name.startswith(f"{prefix}_"))
    log.warning(
        "%s: %d thread(s) of its event loop (asyncio.to_thread, run_in_executor) still ran "
        "%g s after it returned: %s. A thread cannot be stopped: they are left running, and "
        "the interpreter waits for them to end before it exits",
        who, len(names), CANCEL_GRACE_SECONDS, ", ".join(names),
    )  # fmt: skip

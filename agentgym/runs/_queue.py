"""`JobQueue`: runs the store's queued jobs in at most N ``agentgym`` worker subprocesses.

The queue lives in the database, so it survives the process that runs it: ``agentgym serve``
runs the jobs submitted over HTTP (``sweep_id`` None), ``agentgym sweep`` the jobs of its own
sweep. Each job's process writes its run folder (``output.log`` gets its stdout and stderr).

Policy when a job's process ends (`JobQueue._settle`):

- exit 0: ``finished``; a cancel was requested: ``cancelled``;
- exit 2 (bad config) or 1 (a crash in our code): ``failed``, never retried;
- an infrastructure failure (exit 75, or a kill signal) while the queue is up: re-queued with
  ``--resume`` while ``attempt < max_attempts``, else ``failed``;
- the queue itself stopped (its process was killed, or shut down): the job is ``interrupted``;
  the next queue for it (`recover` on start) re-queues it with ``--resume`` when its folder has
  a checkpoint (`has_checkpoint`) and attempts are left; otherwise it stays ``interrupted``.

``--resume`` continues a train run from its last checkpoint, an eval run after its last
finished episode.

The queue shares its event loop with ``agentgym serve``'s HTTP server: every store call it
makes runs in a worker thread (`in_thread`), so a database lock held elsewhere delays the
queue, not every request the server answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from agentgym._pid import process_alive

from .._run_to_end import through_cancels
from ._folder import OUTPUT_LOG, has_checkpoint, log_tail, read_figures, read_step
from ._jobs import job_command
from ._store import RunStatus, RunStore, now_iso
from ._track import is_infra_failure

log = logging.getLogger("agentgym.runs")

_T = TypeVar("_T")


#: How often a running queue looks for CLI runs whose process died (a query of the running
#: rows and a pid check each).
RECONCILE_EVERY_S = 5.0


class JobQueue:
    """Start queued jobs as subprocesses, at most ``workers`` at a time.

    Args:
        store: the run store holding the queue.
        workers: most jobs running at once.
        sweep_id: run only this sweep's jobs; None: only jobs of no sweep (``serve``).
        poll_s: how often the database is looked at for new jobs and cancel requests.
        grace_s: after SIGTERM, how long a job may take to stop before SIGKILL.
    """

    def __init__(
        self,
        store: RunStore,
        *,
        workers: int = 2,
        sweep_id: str | None = None,
        poll_s: float = 0.5,
        grace_s: float = 10.0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.store, self.workers, self.sweep_id = store, workers, sweep_id
        self.poll_s, self.grace_s = poll_s, grace_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._term_sent: dict[str, float] = {}
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    def recover(self) -> list[str]:
        """Settle the jobs a dead queue left ``running``; returns the ids re-queued.

        Each becomes ``interrupted``; a worker process it orphaned is stopped first (two
        writers must never share a folder); then the interruption policy applies.
        """
        requeued = []
        for row in self.store.reconcile(jobs=True):
            if row["job"] is None or row["sweep_id"] != self.sweep_id:
                continue  # a CLI run, or another sweep's job: marked, not ours to restart
            _stop_orphan(row["pid"], self.grace_s)
            if self._requeue_interrupted(row["id"]):
                requeued.append(row["id"])
        return requeued

    def wake(self) -> None:
        """Look at the queue now (thread-safe), e.g. right after a submission."""
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self, *, until_idle: bool = False) -> None:
        """Start jobs as slots free up; with ``until_idle``, return once none is left."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        settled_at = -math.inf
        while not self._stopping:
            # CLI runs of this host whose process died become interrupted: a dashboard
            # following one streamed forever, and the API said "running", until a `runs ls`
            if time.monotonic() - settled_at >= RECONCILE_EVERY_S:
                await in_thread(self.store.reconcile)
                settled_at = time.monotonic()
            await self._forward_cancels()
            # count tasks, not processes: a job's process exists only once its task has run,
            # so counting processes claimed every queued job in one pass (`--parallel 1` ran
            # a whole sweep at once)
            while len(self._tasks) < self.workers and not self._stopping:
                job = await self._claim()
                if job is None:
                    break
                self._spawn(job)
            if until_idle and not self._tasks:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            self._wake.clear()

    async def shutdown(self) -> None:
        """Stop starting jobs, stop the running ones (they become ``interrupted``)."""
        self._stopping = True
        for proc in self._procs.values():
            _signal_group(proc.pid, signal.SIGTERM)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.grace_s)
        for proc in self._procs.values():
            _signal_group(proc.pid, signal.SIGKILL)
        if self._tasks:
            await asyncio.wait(self._tasks)

    async def _claim(self) -> dict[str, Any] | None:
        """The next job, claimed in a worker thread; None when none is queued or we stop.

        A job claimed while the queue began to stop, or whose claim outlived a cancelled
        caller, is handed back (`RunStore.release`): no process would ever run it.
        """
        job = await in_thread(
            lambda: self.store.claim_next(self.owner, sweep_id=self.sweep_id), undo=self._release
        )
        if job is not None and self._stopping:
            await in_thread(lambda: self._release(job))
            return None
        return job

    def _release(self, job: dict[str, Any] | None) -> None:
        """Hand back a claimed ``job`` (None: nothing was claimed); a store write, off the loop."""
        if job is not None:
            self.store.release(job["id"], self.owner)

    # ---- one job ---------------------------------------------------------------------------
    def _spawn(self, job: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._run_one(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda done: self._start_failed(job["id"], done))

    def _start_failed(self, run_id: str, task: asyncio.Task[None]) -> None:
        """Mark ``failed``, with the reason, a job whose process could not be started.

        Why: an exception before the process exists (argument list too long, a folder that
        cannot be written) would otherwise leave the job ``running`` with no process, forever.
        A job cancelled before its process was recorded (the loop closing as it started) is
        handed back (`RunStore.release`; nothing when its pid is there): the next queue found
        it ``interrupted`` with no checkpoint, a job that never ran.
        """
        if task.cancelled():
            self.store.release(run_id, self.owner)
            return
        if task.exception() is None:
            return
        exc = task.exception()
        log.error("job %s: cannot start its process: %r", run_id, exc)
        self.store.update_run(
            run_id, only_if={"owner": self.owner, "status": "running", "pid": None},
            status=RunStatus.failed, ended_at=now_iso(),
            error_tail=f"the job's process could not be started: {type(exc).__name__}: {exc}",
        )  # fmt: skip

    async def _run_one(self, job: dict[str, Any]) -> None:
        run_dir = Path(job["run_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        spec = job["job"]
        argv = job_command(spec["kind"], spec["config"], run_dir, bool(job["resume"]))
        env = {**os.environ, "AGENTGYM_RUN_ID": job["id"], "AGENTGYM_RUNS_DB": self.store.url}
        with (run_dir / OUTPUT_LOG).open("ab") as out:
            out.write(f"--- attempt {job['attempt']} at {now_iso()}\n".encode())
            out.flush()
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,  # its own group: a cancel stops its children
            )  # fmt: skip
        self._procs[job["id"]] = proc
        try:
            await in_thread(
                lambda: self.store.update_run(job["id"], only_if={"owner": self.owner},
                                              pid=proc.pid)
            )  # fmt: skip
            code = await proc.wait()
        except BaseException:  # the loop is closing (Ctrl-C), or its pid could not be recorded
            _signal_group(proc.pid, signal.SIGKILL)  # (nothing would ever stop it): none left
            await asyncio.shield(proc.wait())
            raise
        finally:
            del self._procs[job["id"]]
            self._term_sent.pop(job["id"], None)
        await in_thread(lambda: self._settle(job["id"], code))

    def _settle(self, run_id: str, code: int) -> None:
        """Record how a job's process ended and what happens next (module docstring)."""
        row = self.store.get_run(run_id)
        if row is None:
            return
        run_dir = Path(row["run_dir"])
        values: dict[str, Any] = {
            "exit_code": code, "ended_at": now_iso(), "figures": read_figures(run_dir),
            "step": read_step(run_dir), "error_tail": log_tail(run_dir) if code else None,
        }  # fmt: skip
        guard = {"owner": self.owner}
        if row["cancel_requested"]:
            self.store.update_run(run_id, only_if=guard, status=RunStatus.cancelled, **values)
        elif code == 0:
            self.store.update_run(run_id, only_if=guard, status=RunStatus.finished, **values)
        elif self._stopping:
            self.store.update_run(run_id, only_if=guard, status=RunStatus.interrupted, **values)
            self._requeue_interrupted(run_id)
        elif is_infra_failure(code) and row["attempt"] < row["max_attempts"]:
            log.warning("job %s: infrastructure failure (exit %d), retrying", run_id, code)
            self.store.update_run(
                run_id, only_if=guard, status=RunStatus.queued, resume=True, owner=None, **values
            )
        else:
            self.store.update_run(run_id, only_if=guard, status=RunStatus.failed, **values)

    def _requeue_interrupted(self, run_id: str) -> bool:
        """Re-queue an ``interrupted`` job with ``--resume`` when it has a checkpoint."""
        row = self.store.get_run(run_id)
        if row is None:
            return False
        if row["attempt"] >= row["max_attempts"]:
            self._stays_interrupted(row, f"its {row['max_attempts']} attempts are used up")
            return False
        if row["cancel_requested"]:  # cancelled while it ran: it stopped, do not resume it
            self.store.update_run(
                run_id, only_if={"status": "interrupted"}, status=RunStatus.cancelled
            )
            return False
        if not has_checkpoint(row["kind"], Path(row["run_dir"])):
            folder = Path(row["run_dir"])
            why = "its folder has no checkpoint to resume from"
            self._stays_interrupted(row, why if folder.is_dir() else f"its folder {folder} is gone")
            return False
        return self.store.update_run(
            run_id, only_if={"status": "interrupted"}, status=RunStatus.queued, resume=True,
            owner=None,
        )  # fmt: skip

    def _stays_interrupted(self, row: dict[str, Any], why: str) -> None:
        """Say in ``error_tail`` why an interrupted job is not resumed, and what to do.

        Why: otherwise the row reads ``interrupted`` with no reason, as if a queue might still
        pick it up.
        """
        tail = log_tail(Path(row["run_dir"])) if row["run_dir"] else None
        note = (
            "agentgym: the job stopped with the queue running it (`agentgym serve` or `sweep` "
            f"shut down or killed) and is not resumed: {why}; resubmit the job"
        )
        self.store.update_run(
            row["id"], only_if={"status": "interrupted"},
            error_tail=f"{tail}\n{note}" if tail else note,
        )  # fmt: skip

    async def _forward_cancels(self) -> None:
        """SIGTERM the jobs whose cancel was requested; SIGKILL them after ``grace_s``."""
        unsent = [run_id for run_id in self._procs if run_id not in self._term_sent]
        requested = await in_thread(lambda: self._cancel_requested(unsent)) if unsent else []
        for run_id in requested:
            proc = self._procs.get(run_id)  # None: it ended while the rows were read
            if proc is not None:
                _signal_group(proc.pid, signal.SIGTERM)
                self._term_sent[run_id] = time.monotonic()
        for run_id, sent in list(self._term_sent.items()):
            proc = self._procs.get(run_id)
            if proc is not None and time.monotonic() - sent > self.grace_s:
                _signal_group(proc.pid, signal.SIGKILL)

    def _cancel_requested(self, run_ids: list[str]) -> list[str]:
        """Which of ``run_ids`` a cancel was requested for (store reads: call off the loop)."""
        rows = (self.store.get_run(run_id) for run_id in run_ids)
        return [row["id"] for row in rows if row is not None and row["cancel_requested"]]


async def in_thread(call: Callable[[], _T], *, undo: Callable[[_T], object] | None = None) -> _T:
    """``call()`` in a worker thread; a cancelled caller still waits for it to end.

    Why: store calls on the event loop froze ``agentgym serve`` while another process held
    the database lock (``/health`` took as long as the lock). In a thread they wait alone;
    but a cancelled ``asyncio.to_thread`` leaves its thread running unseen. Here the caller's
    cancellation waits for the call (its transaction is closed when it propagates) and then
    runs ``undo`` on what it returned, in a thread too (a job claimed for nobody goes back).
    """
    # an executor future, not a task: the loop's shutdown cancels tasks, not this
    loop = asyncio.get_running_loop()
    running = loop.run_in_executor(None, call)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await through_cancels(running)
        if undo is not None and running.exception() is None:
            await through_cancels(loop.run_in_executor(None, undo, running.result()))
        raise


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _stop_orphan(pid: int | None, grace_s: float) -> None:
    """Stop an ``agentgym`` worker a killed queue left behind (its own process group)."""
    if not pid or not process_alive(pid) or not _is_agentgym(pid):
        return
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _is_agentgym(pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a process we do not own: no handle to wait on
    _signal_group(pid, signal.SIGKILL)


def _is_agentgym(pid: int) -> bool:
    """Whether ``pid`` runs agentgym (not a zombie, nor a new process that reused the number)."""
    try:
        return b"agentgym" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False

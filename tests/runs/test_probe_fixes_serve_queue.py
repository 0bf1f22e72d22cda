"""The run store and the job queue while another process holds SQLite's write lock.

Reads must not wait for the lock; the queue waits for it in a worker thread, never on the
event loop it shares with ``agentgym serve``; and a queue cancelled or stopped while its
claim of a job waits hands that job back instead of leaving it ``running`` with no process.
A real SQLite file (and a real PostgreSQL server where the backend does not matter), a plain
``sqlite3`` connection holding the lock as another ``agentgym`` process would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

require("sqlalchemy")
from agentgym.runs import JobQueue, RunStatus, RunStore, _queue  # noqa: E402

#: Longest a read may take while the lock is held (it takes milliseconds; the lock, 30 s):
#: well between the two, for a first query's set-up on a saturated machine too.
ANSWER_S = 10.0
#: Bound on every wait below that should end at once.
WAIT_S = 20.0


@contextlib.contextmanager
def write_lock(db: Path) -> Iterator[None]:
    """Hold the write lock of the SQLite file ``db`` while the block runs."""
    conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def queued_job(store: RunStore, tmp_path: Path) -> str:
    """A queued job's row (the queue never gets to start its process in these tests)."""
    job = {"kind": "eval", "config": {}}
    return store.create_run(
        kind="eval", name="job", config={}, source="test", run_dir=tmp_path / "run", job=job
    )


def test_reads_do_not_wait_for_a_held_write_lock(tmp_path: Path) -> None:
    """Every transaction began ``BEGIN IMMEDIATE``: a listing waited for any writer's lock."""
    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    run_id = queued_job(store, tmp_path)
    reads: dict[str, Callable[[], Any]] = {
        "get_run": lambda: store.get_run(run_id), "find_run": lambda: store.find_run(run_id[:4]),
        "list_runs": store.list_runs, "reconcile": store.reconcile,
    }  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor() as pool, write_lock(tmp_path / "runs.db"):
        answers = {name: pool.submit(read) for name, read in reads.items()}
        for name, answer in answers.items():
            try:
                answer.result(timeout=ANSWER_S)
            except TimeoutError:
                pytest.fail(f"RunStore.{name} waited for another process's write lock")
    assert store.get_run(run_id)["status"] == "queued"


def test_a_claimed_job_handed_back_is_queued_again(db_url: str, tmp_path: Path) -> None:
    store = RunStore(db_url)
    run_id = queued_job(store, tmp_path)
    claimed = store.claim_next("host:1")
    assert claimed is not None and claimed["attempt"] == 1
    assert not store.release(run_id, "host:2")  # another queue's claim: not ours to hand back
    assert store.release(run_id, "host:1")
    row = store.get_run(run_id)
    assert (row["status"], row["attempt"], row["owner"], row["started_at"]) == (
        "queued", 0, None, None)  # fmt: skip
    store.claim_next("host:1")
    store.update_run(run_id, pid=4242)  # its process started: the queue settles it instead
    assert not store.release(run_id, "host:1")
    assert store.get_run(run_id)["status"] == RunStatus.running


async def test_a_cancelled_call_in_a_thread_is_waited_for_then_undone() -> None:
    """``asyncio.to_thread`` cancelled lets its thread run on unseen: a claim made there
    would be nobody's job."""
    go, undone = threading.Event(), []
    task = asyncio.create_task(_queue.in_thread(lambda: go.wait(WAIT_S) and "claimed",
                                         undo=undone.append))  # fmt: skip
    await asyncio.sleep(0)  # let it start its thread
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=0.2)
    assert not done, "the cancelled caller went on while its call still ran"
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_S)
    assert undone == ["claimed"]


async def test_a_call_in_a_thread_cancelled_twice_is_still_undone() -> None:
    """A second cancel ended the wait early and skipped the undo."""
    called, go, undoing, undo_may_end = (threading.Event() for _ in range(4))
    undone = []

    def call() -> str:
        called.set()
        go.wait(WAIT_S)
        return "claimed"

    def undo(result: str) -> None:
        undoing.set()
        undo_may_end.wait(WAIT_S)
        undone.append(result)

    async def until(event: threading.Event) -> None:  # polls a thread's flag, bounded
        deadline = time.monotonic() + WAIT_S
        while not event.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    task = asyncio.create_task(_queue.in_thread(call, undo=undo))
    await until(called)
    task.cancel()
    await asyncio.sleep(0)  # the cancel is taken
    task.cancel()  # again, while it waits for the call
    go.set()
    await until(undoing)
    task.cancel()  # and while the undo runs
    undo_may_end.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_S)
    assert undone == ["claimed"]


def _awaits(task: asyncio.Task[Any], name: str) -> bool:
    """Whether ``task`` is awaiting (at any depth) a coroutine function called ``name``."""
    coro: Any = task.get_coro()
    while coro is not None:
        if getattr(getattr(coro, "cr_code", None), "co_name", None) == name:
            return True
        coro = getattr(coro, "cr_await", None)
    return False


@pytest.mark.parametrize("stop", ["cancel", "shutdown"])
def test_a_queue_stopped_while_its_claim_waits_for_the_lock_hands_the_job_back(
    tmp_path: Path, stop: str
) -> None:
    """The queue claimed on the event loop (``serve`` froze with it); in a thread, a claim
    that ends after the queue was cancelled (Ctrl-C, server shutdown) or began to stop left
    the job ``running`` with no process, and the next queue found it interrupted."""
    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    run_id = queued_job(store, tmp_path)
    queue = JobQueue(store, workers=1, poll_s=0.05)
    loop = asyncio.new_event_loop()
    runner = loop.create_task(queue.run())
    stopped = threading.Event()

    async def stop_once_claiming() -> None:  # polls the task it stops: no other signal exists
        while not _awaits(runner, "_claim"):
            await asyncio.sleep(0.01)
        runner.cancel() if stop == "cancel" else await queue.shutdown()
        stopped.set()

    stopper = loop.create_task(stop_once_claiming())

    def run_loop() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(asyncio.gather(runner, stopper))

    thread = threading.Thread(target=run_loop, daemon=True)
    try:
        with write_lock(tmp_path / "runs.db"):
            thread.start()
            assert stopped.wait(WAIT_S), "the queue's event loop waited for the lock"
            assert not runner.done(), "the queue ended while its claim still ran"
        thread.join(WAIT_S)
        assert not thread.is_alive(), "the queue did not end once the lock was released"
    finally:  # a queue that never got to its claim: end it, and the task waiting for that
        for task in (runner, stopper):
            loop.call_soon_threadsafe(task.cancel)
        thread.join(WAIT_S)
        loop.close()
    row = store.get_run(run_id)
    assert (row["status"], row["attempt"], row["owner"], row["pid"]) == ("queued", 0, None, None)


async def test_a_job_cancelled_before_its_process_is_recorded_is_queued_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its process started (the loop closing), the job stayed ``running``
    with no pid; the next queue found it interrupted with no checkpoint, never run."""
    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    run_id = queued_job(store, tmp_path)
    queue = JobQueue(store, workers=1, poll_s=0.05)
    starting = asyncio.Event()

    async def never_starts(*args: Any, **kwargs: Any) -> Any:
        starting.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(_queue, "job_command", lambda *args: ["true"])
    monkeypatch.setattr(_queue.asyncio, "create_subprocess_exec", never_starts)
    job = await queue._claim()
    assert job is not None
    queue._spawn(job)
    await asyncio.wait_for(starting.wait(), WAIT_S)
    [task] = queue._tasks
    task.cancel()
    await asyncio.wait([task])
    await asyncio.sleep(0)  # the task's done callbacks
    row = store.get_run(run_id)
    assert (row["status"], row["attempt"], row["pid"]) == ("queued", 0, None)


async def test_a_job_whose_pid_cannot_be_recorded_leaves_no_process_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pid's write failing (a lock held past the busy timeout) left the process running
    with no owner: nothing would ever stop it."""
    import sqlalchemy

    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    queued_job(store, tmp_path)
    queue = JobQueue(store, workers=1, poll_s=0.05)
    started: list[asyncio.subprocess.Process] = []
    real_exec, real_update = asyncio.create_subprocess_exec, store.update_run

    async def recording(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        started.append(await real_exec(*args, **kwargs))
        return started[-1]

    def locked(run_id: str, **values: Any) -> Any:
        if "pid" in values:
            raise sqlalchemy.exc.OperationalError("UPDATE", {}, Exception("database is locked"))
        return real_update(run_id, **values)

    monkeypatch.setattr(_queue, "job_command", lambda *args: ["sleep", "60"])
    monkeypatch.setattr(_queue.asyncio, "create_subprocess_exec", recording)
    job = await queue._claim()
    assert job is not None
    monkeypatch.setattr(store, "update_run", locked)
    queue._spawn(job)
    [task] = queue._tasks
    try:
        with pytest.raises(sqlalchemy.exc.OperationalError):
            await asyncio.wait_for(task, WAIT_S)
        [proc] = started
        assert proc.returncode is not None  # killed and waited for
        assert not queue._procs
    finally:
        for proc in started:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

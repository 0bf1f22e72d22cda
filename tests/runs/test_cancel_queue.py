"""A queue task cancelled while it waits for its job's process stops that process.

What cancels it: ``asyncio.run`` cancelling the leftover tasks on Ctrl-C (``agentgym runs
sweep``). The job runs in its own process group, which the terminal's SIGINT never reaches.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from agentgym.runs import JobQueue, RunStore, _queue


async def test_a_job_task_cancelled_at_its_wait_kills_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    store.create_run(kind="eval", name="long", config={}, source="test",
                     run_dir=tmp_path / "run", job={"kind": "eval", "config": {}})  # fmt: skip
    # the job's command: a process (with a child, in its group) that runs for an hour
    sleeper = "import subprocess, time; subprocess.Popen(['sleep', '3600']); time.sleep(3600)"
    monkeypatch.setattr(_queue, "job_command", lambda *a: [sys.executable, "-c", sleeper])
    queue = JobQueue(store, workers=1)
    job = store.claim_next(queue.owner)
    started = asyncio.Event()
    update = store.update_run

    def update_run(run_id, **values):  # called with the pid just before `await proc.wait()`
        update(run_id, **values)
        if "pid" in values:
            started.set()

    monkeypatch.setattr(store, "update_run", update_run)
    task = asyncio.create_task(queue._run_one(job))
    await started.wait()
    proc = queue._procs[job["id"]]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert proc.returncode is not None, "the job's process runs on"
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nor is anything of its group left

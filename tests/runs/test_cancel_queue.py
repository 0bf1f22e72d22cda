"""A queue task cancelled while it waits for its job's process stops that process.

What cancels it: ``asyncio.run`` cancelling the leftover tasks on Ctrl-C (``agentgym runs
sweep``). The job runs in its own process group, which the terminal's SIGINT never reaches.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from agentgym.runs import JobQueue, RunStore, _queue


async def test_a_job_task_cancelled_at_its_wait_kills_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    store.create_run(kind="eval", name="long", config={}, source="test",
                     run_dir=tmp_path / "run", job={"kind": "eval", "config": {}})  # fmt: skip
    # the job's command: a process (with a child, in its group) that runs for an hour; it
    # names its child in a file once the child exists
    marker = tmp_path / "child.pid"
    sleeper = (
        "import os, subprocess, time; child = subprocess.Popen(['sleep', '3600']); "
        f"open({str(marker)!r} + '.tmp', 'w').write(str(child.pid)); "
        f"os.replace({str(marker)!r} + '.tmp', {str(marker)!r}); time.sleep(3600)"
    )
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
    await asyncio.wait_for(started.wait(), 60)
    proc = queue._procs[job["id"]]
    deadline = time.monotonic() + 30  # the job's interpreter starts and spawns its child
    while not marker.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    child = int(marker.read_text())
    assert child in live_members(proc.pid)  # the group holds the child: the check below bites
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert proc.returncode is not None, "the job's process runs on"
    # nor is anything of its group left alive (a killed child may linger as a zombie until
    # init reaps it, and SIGKILL takes a moment to land: poll the kernel, bounded)
    deadline = time.monotonic() + 10
    while (alive := live_members(proc.pid)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert alive == [], f"processes of the job's group still run: {alive}"


def live_members(pgid: int) -> list[int]:
    """Pids of the processes in group ``pgid`` that are not zombies."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members

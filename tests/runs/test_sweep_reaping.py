"""A sweep killed with ``kill -9``: its rows must not read ``running`` forever, and its
jobs are cancelled through one path (`RunStore.request_cancel`), whoever cancels them.

The queue is ``host:pid`` in ``owner``, its worker ``pid``; a dead pid stands for each here.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from tests.conftest import require

require("sqlalchemy")
from agentgym.runs import RunStatus, RunStore  # noqa: E402
from agentgym.runs._cli import _cancel_queued  # noqa: E402


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _sweep_job(store: RunStore, status: RunStatus, **values: object) -> str:
    return store.create_run(kind="eval", name="ev", config={}, source="sweep", status=status,
                            job={"kind": "eval", "config": {}}, sweep_id="sw1",
                            host=socket.gethostname(), **values)  # fmt: skip


@pytest.mark.parametrize("jobs", [False, True])  # `runs ls`; `agentgym serve` recovering
def test_a_killed_sweeps_rows_are_settled_by_the_next_listing(db: str, jobs: bool) -> None:
    store = RunStore(db)
    owner = f"{socket.gethostname()}:{_dead_pid()}"
    ran = _sweep_job(store, RunStatus.running, owner=owner, pid=_dead_pid())
    waited = _sweep_job(store, RunStatus.queued)
    store.reconcile(jobs=jobs)
    assert store.get_run(ran)["status"] == "interrupted"
    left = store.get_run(waited)
    assert left["status"] == "cancelled" and left["cancel_requested"]
    assert "its agentgym sweep" in left["error_tail"] and "died" in left["error_tail"]


def test_a_killed_sweeps_job_whose_worker_still_runs_stays_running(db: str) -> None:
    store = RunStore(db)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ran = _sweep_job(store, RunStatus.running, owner=f"{socket.gethostname()}:{_dead_pid()}",
                         pid=worker.pid)  # fmt: skip
        store.reconcile()
        store.reconcile(jobs=True)  # a serve queue recovering its own jobs too
        assert store.get_run(ran)["status"] == "running"  # it still writes its folder
    finally:
        worker.kill()
        worker.wait()
    store.reconcile()
    assert store.get_run(ran)["status"] == "interrupted"


def test_a_stopped_sweep_cancels_as_the_api_does(db: str) -> None:
    """Two paths disagreed: the sweep's cancel left ``cancel_requested`` unset."""
    store = RunStore(db)
    waited = _sweep_job(store, RunStatus.queued)
    _cancel_queued(store, "sw1", signal.SIGTERM)
    row = store.get_run(waited)
    assert row["status"] == "cancelled" and row["cancel_requested"]
    assert "agentgym sweep was stopped (SIGTERM)" in row["error_tail"]
    assert store.request_cancel(waited) == row  # a second cancel changes nothing

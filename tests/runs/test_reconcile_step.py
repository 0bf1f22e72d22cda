"""`RunStore.reconcile` fills the step a killed run's folder recorded (``runs ls`` showed "-")."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import require

require("sqlalchemy")

from agentgym.runs import RunStatus, RunStore  # noqa: E402


def dead_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def killed_run(store: RunStore, run_dir: Path, step: int | None, recorded: int | None) -> str:
    """A ``running`` train row whose process is gone; its folder's status.json at ``recorded``."""
    run_dir.mkdir()
    if recorded is not None:
        (run_dir / "status.json").write_text(json.dumps({"state": "running", "step": recorded}))
    run_id = store.create_run(kind="train", name=run_dir.name, config={}, source="cli",
                              status=RunStatus.running, pid=dead_pid(), host=socket.gethostname(),
                              run_dir=run_dir)  # fmt: skip
    if step is not None:
        store.update_run(run_id, step=step)
    return run_id


def test_a_run_marked_interrupted_takes_the_step_its_folder_recorded(
    db_url: str, tmp_path: Path
) -> None:
    """kill -9 of ``agentgym train`` at step 3: the row was interrupted with step None."""
    store = RunStore(db_url)
    unset = killed_run(store, tmp_path / "unset", None, 3)
    behind = killed_run(store, tmp_path / "behind", 2, 5)
    ahead = killed_run(store, tmp_path / "ahead", 6, 4)  # the row's own is never lowered
    blank = killed_run(store, tmp_path / "blank", None, None)  # nothing recorded: left so
    assert {r["id"] for r in store.reconcile()} == {unset, behind, ahead, blank}
    rows = {i: store.get_run(i) for i in (unset, behind, ahead, blank)}
    assert {i: r["status"] for i, r in rows.items()} == dict.fromkeys(rows, "interrupted")
    assert {i: r["step"] for i, r in rows.items()} == {unset: 3, behind: 5, ahead: 6, blank: None}

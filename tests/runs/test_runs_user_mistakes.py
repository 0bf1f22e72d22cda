"""A store path that is a folder, and ids that match several runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

require("sqlalchemy")
from agentgym import ConfigError  # noqa: E402
from agentgym.runs import RunStore  # noqa: E402

AGENTGYM = [sys.executable, "-c", "from agentgym.cli import main; main()"]


def agentgym(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "AGENTGYM_RUNS_DB": db, "COLUMNS": "200"}
    return subprocess.run(
        [*AGENTGYM, *args], capture_output=True, text=True, env=environ, timeout=120
    )


@pytest.mark.parametrize("form", ["{folder}", "sqlite:///{folder}"])
def test_a_folder_given_as_the_database_names_a_file_to_use(form: str, tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    with pytest.raises(ConfigError) as caught:
        RunStore(form.format(folder=folder))
    message = str(caught.value)
    assert "a folder, not a database file" in message and "\n" not in message
    assert str(folder / "runs.db") in message  # the fix, spelt out
    assert list(folder.iterdir()) == []  # nothing written into it
    RunStore("sqlite://").close()  # in memory: no path, not "a folder"


def test_runs_show_tells_an_ambiguous_prefix_from_an_unknown_id(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    store = RunStore(db)
    for run_id in ("abc000000001", "abc000000002", "def000000003"):
        store.create_run(kind="eval", name=run_id, config={}, source="cli", run_id=run_id)
    store.close()
    several = agentgym("runs", "show", "abc", db=db)
    assert several.returncode == 2, several.stderr
    assert "'abc' is the start of 2 run ids" in several.stderr
    assert "abc000000001" in several.stderr and "give more of the id" in several.stderr
    unknown = agentgym("runs", "show", "zzz", db=db)
    assert unknown.returncode == 2 and "no run with id 'zzz'" in unknown.stderr
    assert "ambiguous" not in unknown.stderr and "agentgym runs ls" in unknown.stderr
    empty = agentgym("runs", "compare", "", "def", db=db)
    assert empty.returncode == 2 and "give a run id" in empty.stderr, empty.stderr
    assert agentgym("runs", "show", "abc000000002", db=db).returncode == 0


def test_an_interrupted_job_that_is_not_resumed_says_why(tmp_path: Path) -> None:
    import socket

    from agentgym.runs import JobQueue, RunStatus

    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is now free: the "server" that ran the jobs is gone
    owner, host = f"{socket.gethostname()}:{dead.pid}", socket.gethostname()
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    kept.mkdir()
    (kept / "output.log").write_text("--- attempt 1\nplayed 2 episodes\n")
    ids = {}
    for name, folder in (("kept", kept), ("gone", gone)):
        ids[name] = store.create_run(
            kind="eval", name=name, config={}, source="serve", run_dir=folder,
            job={"kind": "eval", "config": {}}, status=RunStatus.running, owner=owner,
            host=host, attempt=1, max_attempts=3,
        )  # fmt: skip
    assert JobQueue(store).recover() == []  # no checkpoint: neither is re-queued
    kept_row, gone_row = (store.get_run(ids[n]) for n in ("kept", "gone"))
    assert kept_row is not None and gone_row is not None
    assert kept_row["status"] == gone_row["status"] == "interrupted"
    assert kept_row["error_tail"].startswith("--- attempt 1\nplayed 2 episodes\n")
    assert "no checkpoint to resume from; resubmit the job" in kept_row["error_tail"]
    assert f"its folder {gone} is gone; resubmit" in gone_row["error_tail"]
    store.close()


def test_a_grid_that_would_drop_or_repeat_runs_is_refused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    config = tmp_path / "ev.yaml"
    config.write_text("kind: eval\nenv: calculator\nnum_tasks: 1\n")
    twice = agentgym("sweep", str(config), "--grid", "seed=0", "--grid", "seed=1", db=db)
    assert twice.returncode == 2, twice.stderr  # was: one run, seed=1 (seed=0 silently lost)
    assert "--grid names 'seed' more than once" in twice.stderr
    assert "--grid seed=0,1" in twice.stderr
    repeated = agentgym("sweep", str(config), "--grid", "seed=1,1", db=db)
    assert repeated.returncode == 2 and "lists 1 twice" in repeated.stderr, repeated.stderr
    assert RunStore(db).list_runs() == []  # nothing ran

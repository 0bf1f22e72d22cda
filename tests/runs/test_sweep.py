"""``agentgym sweep`` over a grid and over a folder, through the job queue (real subprocesses)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require
from tests.runs.test_track import agentgym

require("sqlalchemy")
from agentgym.runs import RunStore  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_grid_gives_one_run_per_combination(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    config = tmp_path / "calc.yaml"
    config.write_text("kind: eval\nenv: calculator\n")
    proc = agentgym(
        "sweep", str(config), "--grid", "num_tasks=1,2", "--grid", "group_size=1,2",
        "--parallel", "2", "--runs-dir", str(tmp_path / "runs"), db=db,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = RunStore(db).list_runs()
    assert len({r["id"] for r in runs}) == 4 and {r["status"] for r in runs} == {"finished"}
    assert len({r["sweep_id"] for r in runs}) == 1 and {r["source"] for r in runs} == {"sweep"}
    played = sorted((r["config"]["num_tasks"], r["config"]["group_size"], r["step"]) for r in runs)
    assert played == [(1, 1, 1), (1, 2, 2), (2, 1, 2), (2, 2, 4)]


def test_a_failing_run_is_recorded_and_not_retried(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "good.yaml").write_text("env: calculator\nnum_tasks: 1\n")
    # found only once the worker reads the model's template (submission reads no model)
    (folder / "bad.yaml").write_text("env: calculator\npolicy: hf\nmodel_path: tiny\n"
                                     "chat_template_kwargs: '{\"nope\": 1}'\nnum_tasks: 1\n")
    proc = agentgym("sweep", str(folder), "--kind", "eval", "--retries", "3", db=db,
                    AGENTGYM_HOME=str(tmp_path / "home"))  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    by_status = {r["status"]: r for r in RunStore(db).list_runs()}
    assert set(by_status) == {"finished", "failed"}
    failed = by_status["failed"]
    assert (failed["exit_code"], failed["attempt"]) == (2, 1)  # a bad config: one attempt
    assert "the template never reads 'nope'" in failed["error_tail"]
    assert "failed" in proc.stdout
    assert Path(failed["run_dir"]).parent == tmp_path / "home" / "runs"


def test_a_malformed_config_stops_the_sweep_before_anything_runs(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    config = tmp_path / "calc.yaml"
    config.write_text("kind: eval\nenv: calculator\n")
    for grid in ("num_taks=1,2", "num_tasks"):
        proc = agentgym("sweep", str(config), "--grid", grid, db=db)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "did you mean 'num_tasks'" in agentgym("sweep", str(config), "--grid", "num_taks=1",
                                                  db=db).stderr  # fmt: skip
    assert RunStore(db).list_runs() == []


def test_an_empty_config_file_is_named(tmp_path: Path) -> None:
    """"a config must be a mapping of key: value, got NoneType": which of a folder's files?"""
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "a.yaml").write_text("env: calculator\n")
    (folder / "b.yaml").write_text("# nothing here yet\n")
    proc = agentgym("sweep", str(folder), "--kind", "eval", db=f"sqlite:///{tmp_path / 'r.db'}")
    assert proc.returncode == 2, proc.stderr
    assert f"config {folder / 'b.yaml'} is empty; write the run's options" in proc.stderr

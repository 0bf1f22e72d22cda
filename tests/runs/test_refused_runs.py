"""Refused commands and killed runs in the index (a probe's findings).

A refused ``train --resume`` (its config differs; its folder is being written) and each
"nothing to resume" resume of a finished run added a row for a folder another row indexes, and
``runs show FOLDER`` / ``runs compare`` took that newest, empty row over the run that wrote it.
A killed sft run's row, marked interrupted by ``runs ls`` after a rerun into its folder, showed
the rerun's step and the moment ``runs ls`` ran as its end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

require("sqlalchemy")
from agentgym import ConfigError  # noqa: E402
from agentgym.runs import RunStatus, RunStore, track_run  # noqa: E402
from tests.runs.cli import agentgym  # noqa: E402

FIGURES = {"grpo/success": 0.9}


def finished_folder(tmp_path: Path) -> Path:
    """A train folder a finished run wrote (as `test_track`'s refused rerun makes it)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").write_text('{"state": "finished", "step": 3}')
    (run_dir / "summary.json").write_text(json.dumps({"figures": FIGURES}))
    return run_dir


def indexed(store: RunStore, run_dir: Path, **values: object) -> str:
    """The row of the run that wrote ``run_dir`` (finished, its step and figures)."""
    row = {"status": RunStatus.finished, "exit_code": 0, "step": 3, "figures": FIGURES,
           "started_at": "2026-01-01T00:00:00+00:00", **values}  # fmt: skip
    return store.create_run(kind="train", name=run_dir.name, config={"learning_rate": 0.01},
                            source="cli", run_dir=run_dir.resolve(), **row)  # fmt: skip


def dead_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def test_a_refused_train_into_an_indexed_folder_adds_no_row(db: str, tmp_path: Path) -> None:
    """``train`` refused for a folder that holds a run: its failed row hid the run from
    ``runs show FOLDER``."""
    run_dir = finished_folder(tmp_path)
    store = RunStore(db)
    run_id = indexed(store, run_dir)
    config = tmp_path / "run.yaml"
    config.write_text(f"model: tiny\nenv: calculator\noutput_dir: {run_dir}\n")
    refused = agentgym("train", config, db=db)
    assert refused.returncode == 2 and "already holds a run" in refused.stderr, refused.stderr
    assert [r["id"] for r in store.list_runs()] == [run_id]
    shown = agentgym("runs", "show", run_dir, db=db)
    assert shown.returncode == 0 and f"run {run_id}" in shown.stdout, shown.stdout


def test_a_resume_with_nothing_left_adds_no_row(db: str, tmp_path: Path) -> None:
    """Each "nothing to resume" resume of a finished run added a finished row of its own."""
    out = tmp_path / "calc"
    for resume in ((), ("--resume",), ("--resume",)):
        done = agentgym("eval", "calculator", "--policy", "reference", "-n", "2", "--out", out,
                        *resume, db=db)  # fmt: skip
        assert done.returncode == 0, done.stderr
    [run] = RunStore(db).list_runs()
    assert (run["status"], run["step"]) == ("finished", 2)


def test_a_refusal_while_another_run_writes_the_folder_leaves_no_row(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``--resume`` refused because a live run writes the folder was filed "failed at
    step 2": the folder changed under it, so it counted the other run's writes as its own."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    store = RunStore(db_url)
    writer = indexed(store, run_dir, status=RunStatus.running, exit_code=None, step=None,
                     figures={}, pid=os.getpid(), host=socket.gethostname())  # fmt: skip
    monkeypatch.setenv("AGENTGYM_RUNS_DB", db_url)
    with pytest.raises(ConfigError), track_run("train", "t", {}, run_dir):
        (run_dir / "status.json").write_text('{"state": "running", "step": 2}')  # the writer's
        raise ConfigError(f"{run_dir} is being written by process {os.getpid()}")
    assert [r["id"] for r in store.list_runs()] == [writer]


def test_a_queued_jobs_refusal_keeps_its_row(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's row is its queue's (it reads the exit code): never deleted, however it ended."""
    run_dir = finished_folder(tmp_path)
    store = RunStore(db_url)
    indexed(store, run_dir)
    job_id = store.create_run(kind="train", name="job", config={}, source="serve")
    monkeypatch.setenv("AGENTGYM_RUNS_DB", db_url)
    monkeypatch.setenv("AGENTGYM_RUN_ID", job_id)
    with pytest.raises(ConfigError), track_run("train", "t", {}, run_dir):
        raise ConfigError("cannot resume: the config differs")
    job = store.get_run(job_id)
    assert job is not None and (job["status"], job["exit_code"]) == ("failed", 2)


def test_show_and_compare_by_folder_take_the_run_that_wrote_it(db: str, tmp_path: Path) -> None:
    """Rows a refused command left (in a database written before the fix) are newer than the
    run they were refused for; ``runs show FOLDER`` printed the refused one, all "-"."""
    run_dir = finished_folder(tmp_path)
    store = RunStore(db)
    run_id = indexed(store, run_dir)
    refused = store.create_run(
        kind="train", name="run", config={"learning_rate": 0.02}, source="cli",
        run_dir=run_dir.resolve(), status=RunStatus.failed, exit_code=2,
    )  # fmt: skip
    assert store.list_runs()[0]["id"] == refused  # the newest row
    shown = agentgym("runs", "show", run_dir, db=db)
    assert shown.returncode == 0 and f"run {run_id}" in shown.stdout, shown.stdout
    other = tmp_path / "other"
    other.mkdir()
    indexed(store, other, figures={"grpo/success": 0.5})
    compared = agentgym("runs", "compare", other, run_dir, db=db)
    assert compared.returncode == 0 and run_id in compared.stdout, compared.stdout
    assert "0.9" in compared.stdout and refused not in compared.stdout
    assert agentgym("runs", "show", refused, db=db).returncode == 0  # still shown by its id


def killed_sft(store: RunStore, run_dir: Path) -> str:
    """The row of an sft run into ``run_dir`` whose process died without saying so."""
    return store.create_run(
        kind="sft", name=run_dir.name, config={}, source="cli", run_dir=run_dir.resolve(),
        status=RunStatus.running, pid=dead_pid(), host=socket.gethostname(),
        started_at="2026-01-01T00:00:00+00:00", created_at="2026-01-01T00:00:00+00:00",
    )  # fmt: skip


def test_a_killed_run_taken_over_keeps_what_it_recorded(db: str, tmp_path: Path) -> None:
    """sft killed at step 2, rerun to step 6 into the same folder: ``runs ls`` listed the
    killed row at step 6, ended when ``runs ls`` ran."""
    run_dir = tmp_path / "out"
    run_dir.mkdir()
    store = RunStore(db)
    killed = killed_sft(store, run_dir)
    rerun_start = "2026-01-01T00:10:00+00:00"
    indexed(store, run_dir, step=6, started_at=rerun_start, created_at=rerun_start)
    (run_dir / "status.json").write_text('{"state": "finished", "step": 6}')  # the rerun's
    assert agentgym("runs", "ls", db=db).returncode == 0
    row = store.get_run(killed)
    assert row is not None and row["status"] == "interrupted"
    assert (row["step"], row["ended_at"]) == (None, rerun_start)


def test_a_killed_run_ends_at_its_folders_last_write(db: str, tmp_path: Path) -> None:
    """Marked interrupted later, a killed run's row ended "now", not when it stopped writing."""
    run_dir = tmp_path / "out"
    run_dir.mkdir()
    status = run_dir / "status.json"
    status.write_text('{"state": "running", "step": 2}')
    os.utime(status, (1767225900, 1767225900))  # 2026-01-01T00:05:00Z
    store = RunStore(db)
    killed = killed_sft(store, run_dir)
    assert agentgym("runs", "ls", db=db).returncode == 0
    row = store.get_run(killed)
    assert row is not None and (row["status"], row["step"]) == ("interrupted", 2)
    assert row["ended_at"].startswith("2026-01-01T00:05:00"), row["ended_at"]


def test_an_eval_refused_as_its_engine_starts_leaves_no_row(
    db: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A parser or template kwarg the model refuses is found as the engine is built: that
    refusal left a failed row (exit 2), though an eval's refusals leave none (experiments.md)."""
    for option in (["--env-arg", "parser=mistral"],
                   ["--chat-template-kwargs", '{"enable_thinkng": false}']):  # fmt: skip
        done = agentgym("eval", "calculator", "--policy", "hf", "--model-path", tiny_model_dir,
                        *option, "-n", "2", "--out", tmp_path / "out", db=db)  # fmt: skip
        assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr
        assert RunStore(db).list_runs() == [], option

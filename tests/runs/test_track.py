"""Indexing of ``agentgym eval`` runs (the CLI hook), exit codes, and ``agentgym runs``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

require("sqlalchemy")
from agentgym import ConfigError, ModelError  # noqa: E402
from agentgym.runs import EXIT_INFRA, RunStatus, RunStore, is_infra_failure, track_run  # noqa: E402

AGENTGYM = [sys.executable, "-c", "from agentgym.cli import main; main()"]


def agentgym(*args: str, db: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "AGENTGYM_RUNS_DB": db, "COLUMNS": "200", **env}
    return subprocess.run(
        [*AGENTGYM, *args], capture_output=True, text=True, env=environ, timeout=120
    )


def test_an_eval_run_is_indexed_with_its_figures(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    proc = agentgym("eval", "calculator", "-n", "2", "--out", str(tmp_path / "calc"), db=db)
    assert proc.returncode == 0, proc.stderr
    [run] = RunStore(db).list_runs()
    assert (run["kind"], run["name"], run["status"], run["exit_code"], run["source"]) == (
        "eval", "calc", "finished", 0, "cli",
    )  # fmt: skip
    assert run["run_dir"] == str((tmp_path / "calc").resolve())
    assert run["figures"]["reward/mean"] == 1.0 and run["step"] == 2
    assert run["config"]["env"] == "agentgym/Calculator-v0" and run["pid"] > 0
    assert run["started_at"] <= run["ended_at"]


def test_a_refused_config_leaves_no_run(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    for args in (["nope"], ["calculator", "--env-arg", "bogus=1"]):
        proc = agentgym("eval", *args, "--out", str(tmp_path / "x"), db=db)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert RunStore(db).list_runs() == []


def test_an_unreachable_database_is_a_warning_not_a_failed_run(tmp_path: Path) -> None:
    out = tmp_path / "calc"
    dead = "postgresql+psycopg://nobody@127.0.0.1:1/none"
    proc = agentgym("eval", "calculator", "-n", "1", "--out", str(out), db=dead)
    assert proc.returncode == 0, proc.stderr
    assert "not indexed" in proc.stderr and (out / "summary.json").exists()


#: A PostgreSQL URL nothing answers at (port 1 refuses at once), with a password to keep secret.
DEAD_DB = "postgresql+psycopg://nobody:pw-s3cret@127.0.0.1:1/none"


@pytest.mark.parametrize(
    "command", [("runs", "ls"), ("runs", "show", "abc"), ("runs", "compare", "abc", "def")]
)
def test_runs_on_an_unreachable_database_is_one_line_exit_2(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    good = f"sqlite:///{tmp_path / 'runs.db'}"  # --db wins over $AGENTGYM_RUNS_DB
    proc = agentgym(*command, "--db", DEAD_DB, db=good, AGENTGYM_HOME=str(tmp_path))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "cannot open the runs database" in lines[0] and "127.0.0.1:1" in lines[0]
    assert "--db" in lines[0] and "Traceback" not in proc.stderr
    assert "pw-s3cret" not in proc.stdout + proc.stderr


def test_runs_ls_show_and_compare(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    for n in ("1", "3"):
        out = str(tmp_path / f"calc{n}")
        assert agentgym("eval", "calculator", "-n", n, "--out", out, db=db).returncode == 0
    second, first = (r["id"] for r in RunStore(db).list_runs())
    listing = agentgym("runs", "ls", db=db)
    assert listing.returncode == 0 and first in listing.stdout and second in listing.stdout
    assert listing.stdout.count("finished") == 2
    shown = agentgym("runs", "show", first[:5], db=db)
    assert shown.returncode == 0 and "calc1" in shown.stdout and "num_tasks: 1" in shown.stdout
    compared = agentgym("runs", "compare", first, second, db=db)
    assert compared.returncode == 0
    assert "num_tasks" in compared.stdout and "episodes" in compared.stdout
    missing = agentgym("runs", "show", "zzz", db=db)
    assert missing.returncode == 2 and "agentgym runs ls" in missing.stderr
    # a run is also found by its folder, and by the id its folder gives it (a train run's
    # status.json), which is what a user copies from there
    by_folder = agentgym("runs", "show", str(tmp_path / "calc3"), db=db)
    assert by_folder.returncode == 0 and f"run {second}" in by_folder.stdout
    (tmp_path / "calc1" / "status.json").write_text('{"run_id": "feedface1234"}')
    by_own_id = agentgym("runs", "show", "feedf", db=db)
    assert by_own_id.returncode == 0 and f"run {first}" in by_own_id.stdout


def test_runs_print_names_and_configs_as_written(tmp_path: Path) -> None:
    # a run's name (its folder), config and log lines are the user's text, not console markup
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    out = tmp_path / "calc[/INST]" / "[bold]run"  # the run's name is its folder's
    assert agentgym("eval", "calculator", "-n", "1", "--out", str(out), db=db).returncode == 0
    [run] = RunStore(db).list_runs()
    listed = agentgym("runs", "ls", db=db)
    assert listed.returncode == 0 and "[bold]run" in listed.stdout, listed.stderr
    shown = agentgym("runs", "show", run["id"], db=db)
    assert shown.returncode == 0 and "[bold]run" in shown.stdout, shown.stderr
    assert "calc[/INST]" in shown.stdout  # the config's out path


@pytest.mark.parametrize(
    ("raised", "code", "status"),
    [
        (ConfigError("bad knob"), 2, RunStatus.failed),
        (ModelError("server down"), EXIT_INFRA, RunStatus.failed),
        (KeyboardInterrupt(), 130, RunStatus.interrupted),
        (SystemExit(143), 143, RunStatus.interrupted),  # a SIGTERM handler that exits
        (RuntimeError("bug"), 1, RunStatus.failed),
    ],
)
def test_how_a_run_ends_sets_its_status_and_exit_code(
    raised: BaseException, code: int, status: RunStatus, db_url: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("AGENTGYM_RUNS_DB", db_url)
    expected = SystemExit if isinstance(raised, ModelError) else type(raised)
    with pytest.raises(expected) as caught, track_run("train", "t", {"lr": 1}, tmp_path):
        raise raised
    if isinstance(raised, ModelError):
        assert caught.value.code == EXIT_INFRA  # an InfraError leaves with the infra code
    [run] = RunStore(db_url).list_runs()
    assert (run["status"], run["exit_code"], run["config"]) == (status, code, {"lr": 1})
    assert run["error_tail"] and type(raised).__name__ in run["error_tail"]
    assert is_infra_failure(code) == (status is RunStatus.interrupted or code == EXIT_INFRA)


def test_a_queued_row_is_adopted_not_duplicated(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(db_url)
    job_id = store.create_run(kind="eval", name="job", config={}, source="serve")
    monkeypatch.setenv("AGENTGYM_RUNS_DB", db_url)
    monkeypatch.setenv("AGENTGYM_RUN_ID", job_id)
    with track_run("eval", "ignored", {"env": "calculator"}, tmp_path) as run_id:
        assert run_id == job_id and store.get_run(job_id)["status"] == "running"
    [run] = store.list_runs()
    assert (run["id"], run["name"], run["status"], run["source"]) == (
        job_id, "job", "finished", "serve",
    )  # fmt: skip


def test_indexing_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTGYM_RUNS_DB", "off")
    with track_run("eval", "x", {}, tmp_path) as run_id:
        assert run_id is None


def test_a_short_password_is_hidden_where_it_stands_not_in_every_word() -> None:
    """Password "p" printed the driver's message as "***ort 1 failed ... acce***ting"."""
    from agentgym.runs._store import _cannot_open

    said = str(_cannot_open("postgresql+psycopg://u:p@127.0.0.1:1/db",
                            'connection to server at "127.0.0.1", port 1 failed: is it accepting '
                            "TCP/IP connections? password p rejected"))  # fmt: skip
    assert "port 1 failed: is it accepting TCP/IP" in said, said
    assert "password *** rejected" in said and "u:***@127.0.0.1" in said, said


def test_a_refused_rerun_into_a_finished_runs_folder_does_not_take_its_figures(
    tmp_path: Path,
) -> None:
    """A train run refused for a folder that holds a run was listed as failed "at step 3",
    with the figures of the run it was refused for."""
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").write_text('{"state": "finished", "step": 3}')
    (run_dir / "summary.json").write_text('{"figures": {"grpo/success": 0.9}}')
    config = tmp_path / "run.yaml"
    config.write_text(f"model: tiny\nenv: calculator\noutput_dir: {run_dir}\n")
    refused = agentgym("train", str(config), db=db)
    assert refused.returncode == 2 and "already holds a run" in refused.stderr, refused.stderr
    [row] = RunStore(db).list_runs()
    assert (row["status"], row["step"], row["figures"]) == ("failed", None, {})
    said = row["error_tail"]
    assert said.startswith("ConfigError:") and "already holds a run" in said, said

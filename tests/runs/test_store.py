"""`RunStore` on SQLite and a real PostgreSQL: schema migrations, rows, the queue's claims."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import require

require("sqlalchemy")
import sqlalchemy as sa  # noqa: E402

from agentgym import ConfigError  # noqa: E402
from agentgym.runs import RunStatus, RunStore, resolve_db_url, submit_job  # noqa: E402
from agentgym.runs._schema import MIGRATIONS, schema_version  # noqa: E402


def test_open_applies_migrations_once_and_records_the_version(db_url: str) -> None:
    store = RunStore(db_url)
    assert store.schema_version == len(MIGRATIONS) >= 1
    run_id = store.create_run(kind="eval", name="a", config={"x": [1, 2]}, source="cli")
    again = RunStore(db_url)  # reopening migrates nothing and keeps the rows
    with again.engine.connect() as conn:
        assert conn.execute(sa.select(schema_version.c.version)).scalars().all() == [1]
    assert again.get_run(run_id)["config"] == {"x": [1, 2]}


def test_a_name_longer_than_the_column_is_cut_not_refused(db_url: str) -> None:
    """PostgreSQL refuses a name over ``runs.name``'s 200 characters (SQLite keeps it): a CLI
    run in a long-named folder went unindexed, a sweep of a long-named config died."""
    store = RunStore(db_url)
    run_id = store.create_run(kind="eval", name="x" * 300, config={}, source="cli")
    assert store.get_run(run_id)["name"] == "x" * 200


def test_a_database_newer_than_this_code_is_refused(db_url: str) -> None:
    store = RunStore(db_url)
    with store.engine.begin() as conn:
        conn.execute(schema_version.update().values(version=len(MIGRATIONS) + 1))
    with pytest.raises(RuntimeError, match="upgrade agentgym"):
        RunStore(db_url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("foo://x", "sqlalchemy.dialects:foo"),  # no such kind of database
        ("postgresql+psycopg://me:pw-s3cret@127.0.0.1:notaport/db", "notaport"),  # unparsable
        ("postgresql+psycopg://me:pw-s3cret@127.0.0.1:1/db", "127.0.0.1"),  # nothing listens
        ("{file}/runs.db", "cannot create its folder"),  # a file stands where the folder goes
        ("sqlite:///{file}/runs.db", "unable to open database file"),
    ],
)
def test_a_database_that_cannot_be_opened_is_a_one_line_config_error(
    url: str, reason: str, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError) as caught:
        RunStore(url.format(file=tmp_path / "file"))
    message = str(caught.value)
    assert message.startswith("cannot open the runs database ") and reason in message
    assert message.endswith("check --db / $AGENTGYM_RUNS_DB") and "\n" not in message
    assert "pw-s3cret" not in message


def test_rows_round_trip_and_guarded_updates_lose_races(db_url: str) -> None:
    store = RunStore(db_url)
    first = store.create_run(kind="train", name="one", config={}, source="cli")
    second = store.create_run(
        kind="eval", name="two", config={"env": "calculator"}, source="cli",
        status=RunStatus.running, run_dir=Path("/tmp/x"),
    )  # fmt: skip
    assert [r["id"] for r in store.list_runs()] == [second, first]  # newest first
    assert [r["id"] for r in store.list_runs(status="queued")] == [first]
    assert store.update_run(second, only_if={"status": "running"}, status=RunStatus.finished,
                            figures={"reward/mean": 0.5}, step=3)  # fmt: skip
    assert not store.update_run(second, only_if={"status": "running"}, status="failed")
    run = store.get_run(second)
    assert (run["status"], run["figures"], run["step"], run["run_dir"]) == (
        "finished",
        {"reward/mean": 0.5},
        3,
        "/tmp/x",
    )
    assert isinstance(run["created_at"], str) and run["created_at"].endswith("+00:00")
    assert store.find_run(second[:6])["id"] == second
    assert store.get_run("nope") is None and store.find_run("") is None  # "" is ambiguous


def test_each_queued_job_is_claimed_by_exactly_one_queue(db_url: str) -> None:
    store = RunStore(db_url)
    ids = {store.create_run(kind="eval", name=f"j{i}", config={}, source="serve") for i in range(6)}
    store.create_run(kind="eval", name="other", config={}, source="sweep", sweep_id="s1")

    def drain(owner: str) -> list[str]:
        mine = RunStore(db_url)
        claimed = []
        while (job := mine.claim_next(owner)) is not None:
            claimed.append(job["id"])
        return claimed

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(drain, ["h:1", "h:2", "h:3"]))
    flat = [i for r in results for i in r]
    assert sorted(flat) == sorted(ids)  # no job twice, the sweep's job not at all
    assert {r["attempt"] for r in store.list_runs(status="running")} == {1}


def test_cancel_of_a_queued_job_is_immediate_and_of_a_running_one_a_request(db_url: str) -> None:
    store = RunStore(db_url)
    queued = store.create_run(kind="eval", name="q", config={}, source="serve")
    running = store.create_run(kind="eval", name="r", config={}, source="serve",
                               status=RunStatus.running)  # fmt: skip
    assert store.request_cancel(queued)["status"] == "cancelled"
    after = store.request_cancel(running)
    assert (after["status"], after["cancel_requested"]) == ("running", True)
    assert store.request_cancel("nope") is None


def test_reconcile_marks_runs_of_dead_processes_interrupted(db_url: str) -> None:
    store = RunStore(db_url)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    import os
    import socket

    host = socket.gethostname()
    gone = store.create_run(kind="eval", name="gone", config={}, source="cli",
                            status=RunStatus.running, pid=int(dead.stdout), host=host)  # fmt: skip
    alive = store.create_run(kind="eval", name="alive", config={}, source="cli",
                             status=RunStatus.running, pid=os.getpid(), host=host)  # fmt: skip
    elsewhere = store.create_run(kind="eval", name="far", config={}, source="cli",
                                 status=RunStatus.running, pid=1, host="other-host")  # fmt: skip
    # a job of a queue that died: left to the queue's own recovery (``runs ls`` marked it,
    # and the restarted queue then neither stopped its worker nor resumed it)
    job = store.create_run(kind="eval", name="job", config={}, source="serve", job={"k": 1},
                           status=RunStatus.running, owner=f"{host}:{int(dead.stdout)}",
                           host=host)  # fmt: skip
    assert [r["id"] for r in store.reconcile()] == [gone]
    statuses = {i: store.get_run(i)["status"] for i in (gone, alive, elsewhere, job)}
    assert statuses == {gone: "interrupted", alive: "running", elsewhere: "running",
                        job: "running"}  # fmt: skip
    assert [r["id"] for r in store.reconcile(jobs=True)] == [job]  # what `recover` calls


def test_a_running_queue_settles_cli_runs_whose_process_died(db_url: str) -> None:
    """A dashboard following a CLI run killed with -9 streamed forever, and the API said
    "running", until someone ran ``agentgym runs ls``: the server's queue now reconciles."""
    import asyncio
    import socket

    from agentgym.runs import JobQueue

    store = RunStore(db_url)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    killed = store.create_run(kind="eval", name="killed", config={}, source="cli",
                              status=RunStatus.running, pid=int(dead.stdout),
                              host=socket.gethostname())  # fmt: skip
    asyncio.run(asyncio.wait_for(JobQueue(store, poll_s=0.01).run(until_idle=True), 60))
    assert store.get_run(killed)["status"] == "interrupted"


def test_a_bad_job_is_refused_before_a_row_exists(db_url: str, tmp_path: Path) -> None:
    store = RunStore(db_url)
    for kind, config in [("eval", "env: nope"), ("eval", "env: calculator\nnum_taks: 2"),
                         ("eval", "{unclosed"), ("serve", "env: calculator"),
                         ("eval", "env: calculator\ngroup_size: many"),
                         ("eval", "env: calculator\ntemperature: 0.7")]:  # fmt: skip
        with pytest.raises(ConfigError):
            submit_job(store, kind, config, runs_root=tmp_path, source="serve")
    assert store.list_runs() == []
    run_id = submit_job(store, "eval", {"env": "calculator", "num_tasks": 1},
                        runs_root=tmp_path, source="serve")  # fmt: skip
    assert store.get_run(run_id)["run_dir"] == str(tmp_path.resolve() / run_id)


def test_a_job_naming_a_model_or_file_not_here_is_refused_at_submission(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    empty = tmp_path / "sft-out"  # a folder, but no model in it (a typo'd run folder, say)
    empty.mkdir()
    refusals = {
        f"train job model: {empty} is not a model folder (no config.json)":
            ("train", {"model": str(empty), "env": "calculator"}),
        "eval job model_path: ./no-such-model is not a model folder":
            ("eval", {"env": "calculator", "policy": "vllm", "model_path": "./no-such-model"}),
        "eval job adapter: runs/old does not exist (from ":
            ("eval", {"env": "calculator", "policy": "vllm", "model_path": "tiny",
                      "adapter": "runs/old"}),
        # a device the worker here does not have (the CPU build of torch in CI; a GPU machine
        # has no 8th GPU either)
        "sft job device: device 'cuda:7', but torch ":
            ("sft", {"model": "tiny", "env": "calculator", "device": "cuda:7"}),
    }  # fmt: skip
    for reason, (kind, config) in refusals.items():
        with pytest.raises(ConfigError) as refused:
            submit_job(store, kind, config, runs_root=tmp_path, source="serve")
        assert str(refused.value).startswith(reason), refused.value
    assert store.list_runs() == []
    hub_id = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "env": "calculator"}  # the worker fetches it
    submit_job(store, "train", hub_id, runs_root=tmp_path, source="serve")


def test_database_location_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTGYM_RUNS_DB", raising=False)
    monkeypatch.setenv("AGENTGYM_HOME", str(tmp_path / "home"))
    assert resolve_db_url() == f"sqlite:///{tmp_path / 'home' / 'runs.db'}"
    monkeypatch.setenv("AGENTGYM_RUNS_DB", "postgresql+psycopg://u@h/db")
    assert resolve_db_url() == "postgresql+psycopg://u@h/db"
    assert resolve_db_url(str(tmp_path / "x.db")) == f"sqlite:///{tmp_path / 'x.db'}"

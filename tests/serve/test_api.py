"""``agentgym serve`` over HTTP on loopback: a real server subprocess, real worker processes.

Every test runs against a SQLite file and a real PostgreSQL server (`tests.runs.postgres`).
Jobs are calculator evals with the env's reference script: cheap, and real ``agentgym eval``
processes. A "long" job plays 100,000 episodes one at a time; tests cancel it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import end_process, require
from tests.runs.postgres import BACKENDS, backend_url

require("fastapi")
require("uvicorn")
require("sqlalchemy")
from agentgym.runs import RunStore  # noqa: E402

AGENTGYM = [sys.executable, "-c", "from agentgym.cli import main; main()"]
QUICK = {"env": "calculator", "num_tasks": 3}
LONG = {"env": "calculator", "env_kwargs": {"num_tasks": 20_000}, "num_tasks": 20_000,
        "group_size": 5, "concurrency": 1}  # fmt: skip
START_TIMEOUT_S = 90  # two shared cores under load: imports alone take seconds
JOB_TIMEOUT_S = 90


@dataclass
class Server:
    """A running ``agentgym serve`` subprocess."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    db_url: str
    runs_dir: Path


@contextlib.contextmanager
def api_server(db_url: str, root: Path, *args: str, name: str = "server") -> Iterator[Server]:
    """Start ``agentgym serve --port 0`` on ``db_url``; stop it (SIGTERM) on leaving."""
    log = root / f"{name}.log"
    runs_dir = root / "runs"
    command = [*AGENTGYM, "serve", "--port", "0", "--db", db_url, "--runs-dir", str(runs_dir),
               "--workers", "2", *args]  # fmt: skip
    env = {**os.environ, "AGENTGYM_HOME": str(root / "home")}
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        text = wait_for(
            lambda: "listening on" in (t := log.read_text()) and t,
            START_TIMEOUT_S, "the server to listen", give_up=lambda: proc.poll() is not None,
        )  # fmt: skip
        url = text.split("listening on ", 1)[1].split()[0]
        yield Server(url, proc, log, db_url, runs_dir)
    finally:
        end_process(proc, timeout=30)


def wait_for(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    give_up: Callable[[], bool] = lambda: False,
    detail: Callable[[], Any] = lambda: "",
) -> Any:
    """Poll ``condition`` until it is truthy (returned) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if give_up() or time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what} {detail()}")
        time.sleep(0.05)  # polling with a deadline, not a synchronisation sleep


def submit(client: httpx.Client, config: Any, kind: str = "eval", **extra: Any) -> dict[str, Any]:
    response = client.post("/jobs", json={"kind": kind, "config": config, **extra})
    assert response.status_code == 201, response.text
    return dict(response.json())


def job(client: httpx.Client, run_id: str) -> dict[str, Any]:
    response = client.get(f"/jobs/{run_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_status(client: httpx.Client, run_id: str, *statuses: str) -> dict[str, Any]:
    return dict(wait_for(lambda: (j := job(client, run_id))["status"] in statuses and j,
                         JOB_TIMEOUT_S, f"job {run_id} to be {statuses}",
                         detail=lambda: job(client, run_id)))  # fmt: skip


def episodes(run_dir: str) -> list[tuple[int, int]]:
    """(task, group) of each complete line of an eval's trajectories.jsonl."""
    path = Path(run_dir) / "trajectories.jsonl"
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    return [(e["task_index"], e["group_index"]) for e in map(json.loads, lines)]


def wait_running_with_episodes(client: httpx.Client, run_id: str, n: int = 5) -> dict[str, Any]:
    return dict(wait_for(
        lambda: (j := job(client, run_id))["status"] == "running" and j["pid"]
        and len(episodes(j["run_dir"])) >= n and j,
        JOB_TIMEOUT_S, f"job {run_id} to play {n} episodes",
        detail=lambda: (job(client, run_id), client.get(f"/jobs/{run_id}/logs").text[-2000:]),
    ))  # fmt: skip


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    root = tmp_path_factory.mktemp(f"serve-{request.param}")
    with api_server(backend_url(request.param, root), root) as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def test_cancelling_a_command_line_run_says_what_it_is(
    client: httpx.Client, server: Server
) -> None:
    """A finished one was told "stop its process (pid N) instead": a pid that may be another
    process's by then. A running one still gets that advice."""
    store = RunStore(server.db_url)
    try:
        finished = store.create_run(kind="eval", name="cli", config={}, source="cli",
                                    status="finished", pid=1, host="here")  # fmt: skip
        running = store.create_run(kind="eval", name="cli", config={}, source="cli",
                                   status="running", pid=os.getpid(), host="here")  # fmt: skip
    finally:
        store.close()
    done = client.post(f"/jobs/{finished}/cancel")
    assert done.status_code == 409 and "already finished; nothing to cancel" in done.text
    assert "pid" not in done.text
    live = client.post(f"/jobs/{running}/cancel")
    assert live.status_code == 409 and f"stop its process (pid {os.getpid()}" in live.text


def test_openapi_schema_is_published(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    assert {"/jobs", "/jobs/{run_id}", "/jobs/{run_id}/logs", "/jobs/{run_id}/metrics",
            "/jobs/{run_id}/cancel"} <= set(schema["paths"])  # fmt: skip
    assert "post" in schema["paths"]["/jobs"]


def test_submit_then_follow_logs_and_metrics_to_the_end(client: httpx.Client) -> None:
    yaml_job = submit(client, "env: calculator\nnum_tasks: 2\ngroup_size: 2", name="yaml")
    json_job = submit(client, QUICK)
    assert yaml_job["status"] == "queued" and yaml_job["name"] == "yaml"
    with client.stream("GET", f"/jobs/{json_job['id']}/logs", params={"follow": True}) as r:
        assert r.headers["content-type"].startswith("text/plain")
        log = "".join(r.iter_text())  # ends when the job does
    assert "--- attempt 1" in log and "summary.json" in log
    done = job(client, json_job["id"])
    assert (done["status"], done["exit_code"], done["attempt"]) == ("finished", 0, 1)
    assert done["figures"]["reward/mean"] == 1.0 and done["step"] == 3
    assert done["config"]["env"] == "agentgym/Calculator-v0"  # the resolved config, from eval
    lines = client.get(f"/jobs/{json_job['id']}/metrics").text.splitlines()
    assert [json.loads(line)["final_reward"] for line in lines] == [1.0, 1.0, 1.0]
    assert wait_status(client, yaml_job["id"], "finished")["step"] == 4
    listed = [j["id"] for j in client.get("/jobs").json()]
    assert listed.index(json_job["id"]) < listed.index(yaml_job["id"])  # newest first


def test_bad_input_gets_a_clear_error_and_leaves_no_run(client: httpx.Client) -> None:
    before = len(client.get("/jobs", params={"limit": 10_000}).json())
    cases = [
        ({"kind": "eval", "config": "env: [calculator"}, 400, "not valid YAML"),
        ({"kind": "eval", "config": {"env": "no-such-env"}}, 400, "unknown env"),
        ({"kind": "eval", "config": {"env": "calculator", "num_taks": 1}}, 400, "num_tasks"),
        ({"kind": "eval", "config": {"env": "calculator", "group_size": "x"}}, 400, "group-size"),
        ({"kind": "eval", "config": "- a list"}, 400, "mapping"),
        ({"kind": "train", "config": {"max_stepz": 1}}, 400, "max_steps"),
        ({"kind": "deploy", "config": {}}, 422, "kind"),
        ({"config": {}}, 422, "kind"),
    ]
    for body, code, words in cases:
        response = client.post("/jobs", json=body)
        assert response.status_code == code, (body, response.text)
        assert words in response.text, response.text
    not_json = {"content": b"{not json", "headers": {"content-type": "application/json"}}
    assert client.post("/jobs", **not_json).status_code == 422
    assert len(client.get("/jobs", params={"limit": 10_000}).json()) == before
    assert client.get("/jobs/nope").status_code == 404
    assert client.post("/jobs/nope/cancel").status_code == 404
    assert client.get("/health").json()["ok"] is True


def test_a_failing_job_records_its_exit_code_and_last_log_lines(client: httpx.Client) -> None:
    # options only the model's template finds wrong (submission reads no model): its worker's
    failing = submit(client, {"env": "calculator", "policy": "hf", "model_path": "tiny",
                              "chat_template_kwargs": '{"nope": 1}', "num_tasks": 1})
    done = wait_status(client, failing["id"], "failed")
    assert done["exit_code"] == 2 and done["attempt"] == 1  # a bad config is never retried
    assert "the template never reads 'nope'" in done["error_tail"]
    assert not (Path(done["run_dir"]) / "summary.json").exists()
    assert wait_status(client, submit(client, QUICK)["id"], "finished")  # still serving


@pytest.mark.slow
def test_cancel_stops_a_running_job(client: httpx.Client) -> None:
    long = submit(client, LONG)
    running = wait_running_with_episodes(client, long["id"])
    response = client.post(f"/jobs/{long['id']}/cancel")
    assert response.status_code == 200 and response.json()["cancel_requested"]
    done = wait_status(client, long["id"], "cancelled")
    assert done["exit_code"] == 128 + signal.SIGTERM  # it unwound (`exit_on_sigterm`)
    wait_for(lambda: not _alive(running["pid"]), 30, "the worker to exit")
    assert len(episodes(done["run_dir"])) < 100_000


@pytest.mark.slow
def test_a_killed_worker_is_retried_with_resume(client: httpx.Client) -> None:
    long = submit(client, LONG)
    first = wait_running_with_episodes(client, long["id"])
    os.kill(first["pid"], signal.SIGKILL)  # an infrastructure failure, not the config's
    second = wait_for(
        lambda: (j := job(client, long["id"]))["attempt"] == 2 and j["status"] == "running"
        and j["pid"] and j["pid"] != first["pid"] and j,
        JOB_TIMEOUT_S, "the retry",
    )  # fmt: skip
    assert second["resume"] is True
    played = len(episodes(second["run_dir"]))
    wait_for(lambda: len(episodes(second["run_dir"])) > played + 3, JOB_TIMEOUT_S, "progress")
    done_keys = episodes(second["run_dir"])
    assert len(done_keys) == len(set(done_keys))  # resumed: no episode played twice
    log = client.get(f"/jobs/{long['id']}/logs").text
    assert "--- attempt 2" in log
    client.post(f"/jobs/{long['id']}/cancel")
    assert wait_status(client, long["id"], "cancelled")["attempt"] == 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() != b""  # a zombie is gone
    except FileNotFoundError:  # reaped since the signal
        return False


def test_the_dashboard_reads_the_same_store(client: httpx.Client) -> None:
    require("agentgym.serve._dashboard")  # written separately; mounted when present
    finished = wait_status(client, submit(client, QUICK, name="for-dashboard")["id"], "finished")
    runs = client.get("/api/runs").json()["runs"]
    shown = next(r for r in runs if r["id"] == finished["id"])
    assert (shown["name"], shown["status"], shown["step"]) == ("for-dashboard", "finished", 3)
    assert client.get("/").status_code == 200

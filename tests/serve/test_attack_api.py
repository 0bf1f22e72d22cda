"""The job API against careless and hostile clients: every refusal is a 4xx of one line.

In process (FastAPI's TestClient, the queue not started) over a SQLite store in tmp_path:
DNS rebinding (a foreign ``Host``), oversized and malformed bodies, misspelt fields,
cancels that cannot do anything, and files of a run folder that lead out of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgym.runs import RunStatus, RunStore
from tests.conftest import require

require("fastapi")
from fastapi.testclient import TestClient  # noqa: E402  (needs fastapi)

from agentgym.serve import create_app  # noqa: E402
from agentgym.serve._app import MAX_BODY  # noqa: E402


def _client(store: RunStore, tmp_path: Path, **kwargs: Any) -> TestClient:
    app = create_app(store, runs_root=tmp_path / "runs", **kwargs)
    return TestClient(app, base_url="http://127.0.0.1:8765", raise_server_exceptions=False)


@pytest.fixture
def client(store: RunStore, tmp_path: Path) -> TestClient:
    return _client(store, tmp_path)


def _one_line_4xx(response: Any, status: int) -> str:
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    return detail


def test_without_a_token_a_foreign_host_is_refused(client: TestClient) -> None:
    """DNS rebinding: a page at evil.example re-resolved to 127.0.0.1 sends its own Host."""
    for host in ("evil.example", "evil.example:8765", "127.0.0.1.evil.example", ""):
        detail = _one_line_4xx(client.get("/jobs", headers={"host": host}), 400)
        assert "--token" in detail
    config = {"kind": "eval", "config": {"env": "calculator"}}
    assert client.post("/jobs", json=config, headers={"host": "evil.example"}).status_code == 400
    for host in ("127.0.0.1:8765", "localhost:8765", "localhost", "[::1]:8765", "127.0.0.2"):
        assert client.get("/health", headers={"host": host}).status_code == 200, host


def test_with_a_token_any_host_is_served(store: RunStore, tmp_path: Path) -> None:
    client = _client(store, tmp_path, token="s3cret")
    auth = {"host": "gpu-box.internal:8765", "authorization": "Bearer s3cret"}
    assert client.get("/health", headers=auth).status_code == 200
    assert client.get("/health", headers={"host": "gpu-box.internal"}).status_code == 401


def test_an_oversized_body_is_refused_before_it_is_read(client: TestClient) -> None:
    body = b'{"kind": "eval", "config": "' + b"a" * MAX_BODY + b'"}'
    headers = {"content-type": "application/json"}
    detail = _one_line_4xx(client.post("/jobs", content=body, headers=headers), 413)
    assert str(MAX_BODY) in detail

    def chunks() -> Iterator[bytes]:
        yield body

    response = client.post("/jobs", content=chunks(), headers=headers)  # chunked: no length
    _one_line_4xx(response, 411)
    assert client.get("/jobs").json() == []


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("a: " + "[" * 5000 + "]" * 5000, "nested too deep"),
        # the billion laughs: 8 levels of 9 aliases, a 9**8-value config from 600 bytes
        (
            "env: calculator\nenv_kwargs:\n  a: &a [x,x,x,x,x,x,x,x,x]\n"
            + "".join(
                f"  {chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n"
                for i in range(8)
            ),
            "more than",
        ),
    ],
)
def test_a_config_bomb_is_a_400(client: TestClient, config: str, says: str) -> None:
    for kind in ("eval", "train"):
        response = client.post("/jobs", json={"kind": kind, "config": config})
        assert says in _one_line_4xx(response, 400)
    assert client.get("/jobs").json() == []


def test_a_misspelt_field_is_refused_not_ignored(client: TestClient) -> None:
    body = {"kind": "eval", "config": {"env": "calculator"}, "max_attempt": 5}
    response = client.post("/jobs", json=body)
    assert response.status_code == 422 and "max_attempt" in response.text
    assert client.get("/jobs").json() == []


def test_cancel_refuses_what_it_cannot_stop(client: TestClient, store: RunStore) -> None:
    cli = store.create_run(
        kind="eval", name="cli", config={}, source="cli", status=RunStatus.running, pid=4242
    )
    assert "command line" in _one_line_4xx(client.post(f"/jobs/{cli}/cancel"), 409)
    assert not store.get_run(cli)["cancel_requested"]
    done = client.post("/jobs", json={"kind": "eval", "config": {"env": "calculator"}}).json()
    store.update_run(done["id"], status=RunStatus.finished, exit_code=0)
    assert "already finished" in _one_line_4xx(client.post(f"/jobs/{done['id']}/cancel"), 409)
    queued = client.post("/jobs", json={"kind": "eval", "config": {"env": "calculator"}}).json()
    for _ in range(2):  # a second cancel is a no-op, not an error
        response = client.post(f"/jobs/{queued['id']}/cancel")
        assert response.status_code == 200 and response.json()["status"] == "cancelled"


def test_an_interrupted_job_cancelled_is_not_resumed(client: TestClient, store: RunStore) -> None:
    job = client.post("/jobs", json={"kind": "eval", "config": {"env": "calculator"}}).json()
    store.update_run(job["id"], status=RunStatus.interrupted, attempt=1)
    response = client.post(f"/jobs/{job['id']}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"


def test_run_files_that_lead_out_of_the_folder_are_not_served(
    client: TestClient, store: RunStore, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text('{"step": 1, "token": 42}\nroot:x:0:0\n')
    run_dir = tmp_path / "cli-run"
    run_dir.mkdir()
    (run_dir / "output.log").symlink_to(secret)
    (run_dir / "metrics.jsonl").symlink_to(secret)
    _nothing_is_served(client, _finished_cli_run(store, run_dir))


def test_a_fifo_or_endless_file_does_not_hang_the_server(
    client: TestClient, store: RunStore, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "metrics.jsonl")
    (run_dir / "output.log").symlink_to("/dev/zero")
    _nothing_is_served(client, _finished_cli_run(store, run_dir))


def test_a_fifo_named_as_a_runs_json_files_does_not_hang_the_list_or_its_health(
    client: TestClient, store: RunStore, tmp_path: Path
) -> None:
    """``status.json`` (read for a running run's live step) and ``summary.json`` (a train
    run's figures, read for its health) were opened without the regular-file check: a FIFO
    there blocked ``/api/runs`` and ``/api/runs/{id}/health`` forever, ``runs ls`` too."""
    import socket

    live, done = tmp_path / "live", tmp_path / "done"
    for run_dir in (live, done):
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    os.mkfifo(live / "status.json")
    os.mkfifo(done / "summary.json")
    store.create_run(kind="train", name="live", config={}, source="cli", run_dir=live,
                     status=RunStatus.running, pid=os.getpid(),
                     host=socket.gethostname())  # fmt: skip
    finished = _finished_cli_run(store, done)
    listed = client.get("/api/runs")
    assert listed.status_code == 200 and {r["name"] for r in listed.json()["runs"]} >= {"live"}
    assert client.get(f"/api/runs/{finished}/health").status_code == 200


def _finished_cli_run(store: RunStore, run_dir: Path) -> str:
    return store.create_run(
        kind="train", name="x", config={}, source="cli", status=RunStatus.finished,
        run_dir=run_dir,
    )  # fmt: skip


def _nothing_is_served(client: TestClient, run: str) -> None:
    assert client.get(f"/jobs/{run}/logs").text == ""
    assert client.get(f"/jobs/{run}/metrics").text == ""
    assert client.get(f"/api/runs/{run}/metrics").json()["points"] == []


def test_a_log_line_without_newline_is_shown_and_a_huge_one_is_cut(
    client: TestClient, store: RunStore, tmp_path: Path
) -> None:
    from agentgym.serve._app import MAX_LINE

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "output.log").write_bytes(b"start\n" + b"x" * (3 * MAX_LINE) + b"\nboom: no newline")
    (run_dir / "metrics.jsonl").write_bytes(
        b'{"step": 1, "a": 1}\n{"step": 2, "pad": "' + b"y" * (2 * MAX_LINE) + b'"}\n'
        b'{"step": 3, "a": 3}\n'
    )
    run = _finished_cli_run(store, run_dir)
    lines = client.get(f"/jobs/{run}/logs").text.splitlines()
    assert lines[0] == "start" and lines[-1] == "boom: no newline"
    assert len(lines) > 3 and all(len(line) <= 2 * MAX_LINE for line in lines)  # cut, bounded
    metrics = client.get(f"/jobs/{run}/metrics").text.splitlines()
    assert metrics == ['{"step": 1, "a": 1}', '{"step": 3, "a": 3}']


def test_another_sites_page_cannot_change_jobs(client: TestClient) -> None:
    """CSRF: a page at evil.example POSTs to 127.0.0.1 (a form, or fetch in no-cors mode).

    The Host is loopback, so only what the browser adds tells it apart: ``Origin`` and
    ``Sec-Fetch-Site``. Reading stays open (no CORS headers: the page reads nothing back).
    """
    job = {"kind": "eval", "config": {"env": "calculator"}}
    for headers in ({"origin": "http://evil.example"}, {"origin": "null"},
                    {"origin": "http://localhost:3000"}, {"sec-fetch-site": "cross-site"},
                    {"sec-fetch-site": "same-site"}):  # fmt: skip
        detail = _one_line_4xx(client.post("/jobs", json=job, headers=headers), 403)
        assert "cross-site" in detail
        _one_line_4xx(client.post("/jobs/abc/cancel", headers=headers), 403)
    assert client.get("/jobs").json() == []  # nothing was queued
    assert client.get("/jobs", headers={"origin": "http://evil.example"}).status_code == 200
    same_origin = {"origin": "http://127.0.0.1:8765", "sec-fetch-site": "same-origin"}
    assert client.post("/jobs", json=job, headers=same_origin).status_code == 201
    assert client.post("/jobs", json=job).status_code == 201  # httpx, curl: no Origin

"""Refusals of the job API that used to be silent or unreadable.

A real uvicorn server on loopback (`serve_in_thread`, the queue not started) over a SQLite store.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentgym.runs import RunStatus, RunStore
from agentgym.runs._store import now_iso
from tests.conftest import require

httpx = require("httpx")
require("fastapi")
require("uvicorn")

from agentgym.serve import create_app  # noqa: E402
from agentgym.serve._thread import serve_in_thread  # noqa: E402


@pytest.fixture
def api(store: RunStore, tmp_path: Path) -> Iterator[httpx.Client]:
    app = create_app(store, runs_root=tmp_path / "runs")
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def test_a_misspelt_status_filter_is_refused_not_an_empty_list(
    api: httpx.Client, store: RunStore
) -> None:
    store.create_run(kind="eval", name="e", config={}, source="cli", status=RunStatus.failed)
    assert [r["status"] for r in api.get("/jobs", params={"status": "failed"}).json()] == ["failed"]
    response = api.get("/jobs", params={"status": "faild"})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    assert "'faild'" in detail and "failed" in detail and "interrupted" in detail


@pytest.mark.parametrize("body", [b'{"kind": "eval", "config": ', b"not json", b'{"kind": }'])
def test_a_body_that_is_not_json_gets_a_422_of_one_line(
    api: httpx.Client, store: RunStore, body: bytes
) -> None:
    response = api.post("/jobs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    assert "not valid JSON" in detail and '"kind"' in detail
    assert store.list_runs() == []  # nothing stored
    # other validation errors keep FastAPI's list of errors
    wrong = api.post("/jobs", json={"kind": "nope", "config": {}})
    assert wrong.status_code == 422 and isinstance(wrong.json()["detail"], list)


def test_a_run_whose_folder_was_deleted_says_so_instead_of_reading_empty(
    api: httpx.Client, store: RunStore, tmp_path: Path
) -> None:
    run_dir = tmp_path / "runs" / "gone"
    run_dir.mkdir(parents=True)
    (run_dir / "trajectories.jsonl").write_text("")
    (run_dir / "output.log").write_text("played 3 episodes\n")
    run_id = store.create_run(
        kind="eval", name="é-gone", config={}, source="serve", run_dir=run_dir,
        status=RunStatus.finished, job={"kind": "eval", "config": {}}, started_at=now_iso(),
    )  # fmt: skip
    assert api.get(f"/jobs/{run_id}/logs").text == "played 3 episodes\n"
    shutil.rmtree(run_dir)
    for path in (f"/jobs/{run_id}/logs", f"/jobs/{run_id}/metrics",
                 f"/api/runs/{run_id}/metrics", f"/api/runs/{run_id}/trajectories",
                 f"/api/runs/{run_id}/trajectories/0"):  # fmt: skip
        response = api.get(path)
        assert response.status_code == 404, (path, response.text)
        detail = response.json()["detail"]
        assert str(run_dir) in detail and "deleted" in detail and "\n" not in detail, path
        assert detail.endswith(f"read the row at /jobs/{run_id}"), detail
    assert api.get(f"/jobs/{run_id}").json()["status"] == "finished"  # the row is kept
    # a queued job has no folder yet: its files read as empty, not as an error
    queued = store.create_run(
        kind="eval", name="q", config={}, source="serve", run_dir=tmp_path / "runs" / "q",
        job={"kind": "eval", "config": {}},
    )  # fmt: skip
    assert api.get(f"/jobs/{queued}/logs").status_code == 200
    empty = api.get(f"/api/runs/{queued}/trajectories").json()  # every key a page has
    assert empty == {"total": 0, "matched": 0, "offset": 0, "bad_lines": 0,
                     "length_fences": [None, None], "items": []}  # fmt: skip

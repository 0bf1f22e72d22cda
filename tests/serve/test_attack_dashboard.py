"""The dashboard's JSON API on malformed run folders: it shows what it can, never a 500."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentgym.runs import RunStatus, RunStore
from tests.conftest import require

require("fastapi")
from fastapi import FastAPI  # noqa: E402  (needs fastapi)
from fastapi.testclient import TestClient  # noqa: E402

from agentgym.serve._dashboard import dashboard_router  # noqa: E402

GOOD = {
    "env_id": "calc",
    "messages": [{"role": "user", "content": "<script>alert(1)</script>"}],
    "turns": [{"prompt_ids": [1, 2], "completion_ids": [3], "text": "hi"}],
    "final_reward": 1.0,
}


def _line(record: Any) -> bytes:
    return (json.dumps(record) + "\n").encode()


@pytest.fixture
def client(store: RunStore) -> TestClient:
    app = FastAPI()
    app.include_router(dashboard_router(store))
    return TestClient(app, raise_server_exceptions=False)


def _run(store: RunStore, run_dir: Path, **files: bytes) -> str:
    run_dir.mkdir()
    for name, data in files.items():
        (run_dir / name).write_bytes(data)
    return store.create_run(
        kind="train", name="x", config={}, source="cli", status=RunStatus.finished,
        run_dir=run_dir,
    )  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [
        b"[" * 100_000 + b"]" * 100_000 + b"\n",  # json.loads: RecursionError
        _line({**GOOD, "messages": "hello"}),
        _line({**GOOD, "scores": [1, 2]}),
        _line({**GOOD, "turns": [[1, 2]]}),
    ],
)
def test_a_line_that_is_not_a_trajectory_is_a_bad_line(
    client: TestClient, store: RunStore, tmp_path: Path, bad: bytes
) -> None:
    run = _run(store, tmp_path / "run", **{"trajectories.jsonl": _line(GOOD) + bad + _line(GOOD)})
    page = client.get(f"/api/runs/{run}/trajectories")
    assert page.status_code == 200, page.text
    assert (page.json()["total"], page.json()["bad_lines"]) == (2, 1)


@pytest.mark.parametrize(
    "turn",
    [
        {"prompt_ids": "abc", "completion_ids": [1]},
        {"prompt_ids": [1], "completion_ids": "abc"},
        {"prompt_ids": [1], "completion_ids": [2], "completion_mask": 5},
    ],
)
def test_a_malformed_detail_is_a_422_of_one_line(
    client: TestClient, store: RunStore, tmp_path: Path, turn: dict[str, Any]
) -> None:
    run = _run(store, tmp_path / "run", **{"trajectories.jsonl": _line({**GOOD, "turns": [turn]})})
    assert client.get(f"/api/runs/{run}/trajectories").status_code == 200
    response = client.get(f"/api/runs/{run}/trajectories/0")
    assert response.status_code == 422, response.text
    assert "malformed" in response.json()["detail"] and "\n" not in response.json()["detail"]


def test_malformed_metrics_lines_are_skipped(
    client: TestClient, store: RunStore, tmp_path: Path
) -> None:
    metrics = (
        b'{"step": 1, "a": 1}\n'
        + b"[" * 100_000 + b"]" * 100_000 + b"\n"
        + b'[1, 2]\n{"step": true, "a": 5}\n{"step": 2, "a": NaN, "b": 2}\n{"step": 3, "a"'
    )  # fmt: skip
    run = _run(store, tmp_path / "run", **{"metrics.jsonl": metrics})
    response = client.get(f"/api/runs/{run}/metrics")
    assert response.status_code == 200, response.text
    points = response.json()["points"]
    assert [(p["step"], p["values"]) for p in points] == [(1, {"a": 1}), (2, {"b": 2})]


def test_an_overlong_line_is_skipped_not_loaded(
    client: TestClient, store: RunStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentgym.runs import _episode_index
    from agentgym.serve import _dashboard

    monkeypatch.setattr(_episode_index, "MAX_LINE_BYTES", 1000)  # the trajectory index's limit
    monkeypatch.setattr(_dashboard, "MAX_LINE_BYTES", 1000)  # the metrics reader's
    huge = _line({**GOOD, "pad": "x" * 5000})
    run = _run(
        store, tmp_path / "run",
        **{"trajectories.jsonl": _line(GOOD) + huge + _line(GOOD),
           "metrics.jsonl": b'{"step": 1, "a": 1}\n{"step": 2, "p": "' + b"y" * 5000 + b'"}\n'
           + b'{"step": 3, "a": 3}\n'},
    )  # fmt: skip
    page = client.get(f"/api/runs/{run}/trajectories").json()
    assert (page["total"], page["bad_lines"]) == (2, 1)
    assert client.get(f"/api/runs/{run}/trajectories/1").status_code == 200
    steps = [p["step"] for p in client.get(f"/api/runs/{run}/metrics").json()["points"]]
    assert steps == [1, 3]


def test_symlinks_out_of_the_run_folder_are_not_read(
    client: TestClient, store: RunStore, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(_line(GOOD))
    run_dir = tmp_path / "run"
    run = _run(store, run_dir)
    (run_dir / "trajectories.jsonl").symlink_to(outside)
    (run_dir / "tokenizer.json").symlink_to("/etc/hostname")
    assert client.get(f"/api/runs/{run}/trajectories").json()["total"] == 0
    inside = run_dir / "data.jsonl"  # a link that stays inside the folder is fine
    inside.write_bytes(_line(GOOD))
    (run_dir / "trajectories.jsonl").unlink()
    (run_dir / "trajectories.jsonl").symlink_to(inside)
    assert client.get(f"/api/runs/{run}/trajectories").json()["total"] == 1
    detail = client.get(f"/api/runs/{run}/trajectories/0").json()
    assert "/etc/hostname" not in detail["tokens"]["tokenizer"]

"""Job submission: an eval job's tiny-model adapter is checked, its warnings reach the
submitter, and the server's queue recovers off its event loop.

A folder that is no adapter beside ``model_path: tiny`` was queued and refused by the worker;
``num_tasks`` past the env's tasks warned on the server's stderr, never in the response.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentgym import ConfigError
from tests.conftest import require

require("sqlalchemy")
from agentgym.runs import JobQueue, RunStore, check_job, submit_job  # noqa: E402


def test_a_folder_that_is_no_adapter_beside_a_tiny_model_is_refused_at_submission(
    tmp_path: Path, db: str
) -> None:
    require("transformers")
    store = RunStore(db)
    config = {"env": "calculator", "policy": "hf", "model_path": "tiny",
              "adapter": str(tmp_path)}  # fmt: skip
    with pytest.raises(ConfigError, match="is not a LoRA adapter"):
        submit_job(store, "eval", config, runs_root=tmp_path / "runs", source="serve")
    assert store.list_runs() == []


def test_num_tasks_past_the_envs_tasks_is_a_warning_for_the_submitter(
    tmp_path: Path, db: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    config = {"env": "calculator", "num_tasks": 10**6}
    said = "num_tasks 1000000, but the env has 100 tasks; playing all 100"
    assert check_job("eval", config) == [said]  # what the job API returns to its submitter
    printed = capsys.readouterr()
    assert "1000000" not in printed.out + printed.err  # not on the server's own output
    submit_job(RunStore(db), "eval", config, runs_root=tmp_path / "runs", source="cli")
    assert said in caplog.messages  # a caller with no submitter to answer logs it


def test_the_api_returns_the_warning_and_recovers_in_a_worker_thread(
    tmp_path: Path, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("fastapi")
    require("httpx")
    from fastapi.testclient import TestClient

    from agentgym.serve._app import create_app

    on_loop: list[bool] = []
    real_recover = JobQueue.recover

    def recover(self: JobQueue) -> list[str]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a worker thread runs no event loop
            on_loop.append(False)
        else:
            on_loop.append(True)
        return real_recover(self)

    monkeypatch.setattr(JobQueue, "recover", recover)
    app = create_app(RunStore(db), runs_root=tmp_path / "runs")
    with TestClient(app, base_url="http://127.0.0.1") as client:
        answer = client.post(
            "/jobs", json={"kind": "eval", "config": {"env": "calculator", "num_tasks": 500}}
        )
    assert answer.status_code == 201, answer.text
    assert answer.json()["warnings"] == [
        "num_tasks 500, but the env has 100 tasks; playing all 100"
    ]
    assert on_loop == [False]  # its store calls would block every request meanwhile

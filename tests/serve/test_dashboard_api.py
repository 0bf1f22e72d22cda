"""The dashboard's JSON API over HTTP on loopback (uvicorn + httpx), and its trajectory index."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentgym._trajectory import to_json_line
from tests.conftest import require
from tests.serve.conftest import (
    XSS,
    Dashboard,
    episode,
    eval_run,
    metrics_line,
    other_run,
    sick_run,
)

require("fastapi")
from agentgym.serve._dashboard import IndexCache  # noqa: E402  (needs fastapi)


@pytest.fixture
def client(dashboard: Dashboard) -> Any:
    with httpx.Client(base_url=dashboard.url, timeout=10) as c:
        yield c


def get(client: httpx.Client, url: str, **params: Any) -> Any:
    response = client.get(url, params=params)
    assert response.status_code == 200, response.text
    return response.json()


# ---- runs and metrics ------------------------------------------------------------------------


def test_runs_table_lists_runs_newest_first(client: httpx.Client) -> None:
    runs = get(client, "/api/runs")["runs"]
    assert [r["id"] for r in runs] == ["bb", "a"]
    assert runs[1] | {"run_dir": None} == {
        "id": "a", "kind": "train", "name": "calc-a", "status": "finished", "step": 5,
        "created_at": "2026-11-30T10:01:00+00:00", "figures": {"grpo/success": 0.8},
        "run_dir": None,
    }  # fmt: skip
    assert get(client, "/api/runs/a")["config"] == {"model": "/no/such/model"}


def test_unknown_run_is_a_404_that_says_where_to_look(client: httpx.Client) -> None:
    for url in ("/api/runs/nope", "/api/runs/nope/metrics", "/api/runs/nope/trajectories"):
        response = client.get(url)
        assert response.status_code == 404
        assert response.json()["detail"] == "no run 'nope'; list the runs at /api/runs"


def test_health_lists_a_train_runs_findings(
    client: httpx.Client, dashboard: Dashboard, tmp_path: Path
) -> None:
    assert get(client, "/api/runs/a/health") == {"findings": [], "why": None}
    with sick_run(dashboard, tmp_path):
        body = get(client, "/api/runs/sick/health")
    assert [f["rule"] for f in body["findings"]] == ["tool-errors"]
    assert body["findings"][0]["evidence"].startswith("60% of tool calls were errors")
    assert client.get("/api/runs/nope/health").status_code == 404
    with sick_run(dashboard, tmp_path / "torn") as run:
        with (run.path / "metrics.jsonl").open("a") as f:
            f.write("{not json\n" + metrics_line(9, 0.5))
        torn = get(client, "/api/runs/sick/health")
    assert torn["findings"] == [] and "metrics.jsonl is not a record (not JSON" in torn["why"]


def test_health_reads_an_eval_runs_episodes(
    client: httpx.Client, dashboard: Dashboard, tmp_path: Path
) -> None:
    with eval_run(dashboard, tmp_path):
        body = get(client, "/api/runs/ev/health")
    assert [f["rule"] for f in body["findings"]] == ["tool-errors"] and body["why"] is None
    assert body["findings"][0]["evidence"].startswith("67% of tool calls were errors in this eval")


def test_health_reads_an_sft_runs_record(
    client: httpx.Client, dashboard: Dashboard, tmp_path: Path
) -> None:
    history = [{"step": s, "loss": 1.0} for s in range(1, 21)]
    history[-1]["reference_accuracy"] = 0.25
    record = {"config": {"steps": 20, "target_accuracy": 0.9}, "history": history}
    with other_run(dashboard, tmp_path, "warm", "sft", {"sft.json": json.dumps(record)}):
        body = get(client, "/api/runs/warm/health")
    assert [f["rule"] for f in body["findings"]] == ["warm-start-short"] and body["why"] is None
    with other_run(dashboard, tmp_path / "early", "early", "sft", {}):
        assert get(client, "/api/runs/early/health") == {"findings": [], "why": "no model yet"}


def test_metrics_keep_matching_finite_numbers(client: httpx.Client) -> None:
    body = get(client, "/api/runs/a/metrics", key=["reward/*/mean", "loss/kl"])
    assert [p["step"] for p in body["points"]][:3] == [1, 2, 3]
    assert set(body["points"][0]["values"]) == {
        "reward/correct_answer/mean", "reward/used_calculator/mean", "loss/kl"
    }  # fmt: skip
    everything = get(client, "/api/runs/a/metrics")["points"][0]["values"]
    assert "reward/mean" in everything and "data/tasks" not in everything  # lists are not curves


def test_metrics_poll_sends_only_new_complete_lines(dashboard: Dashboard, tmp_path: Path) -> None:
    from agentgym.serve._dashboard import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text(metrics_line(1, 0.1) + metrics_line(2, 0.2))
    first = read_metrics(path, 0, ["reward/mean"])
    assert [p["values"] for p in first["points"]] == [{"reward/mean": 0.1}, {"reward/mean": 0.2}]
    assert first["next"] == path.stat().st_size and not first["reset"]

    torn, nan_line = metrics_line(4, 0.4), metrics_line(3, float("nan"))
    with path.open("a") as f:
        f.write(nan_line + torn[:20])  # NaN is no point; the torn line is still being written
    second = read_metrics(path, first["next"], ["reward/mean"])
    assert second["points"] == [] and second["next"] == first["next"] + len(nan_line)
    with path.open("a") as f:
        f.write(torn[20:])
    third = read_metrics(path, second["next"], ["reward/mean"])
    assert [p["step"] for p in third["points"]] == [4]

    path.write_text(metrics_line(1, 0.5))  # a resume rolled lines back: the file shrank
    again = read_metrics(path, third["next"], ["reward/mean"])
    assert again["reset"] and [p["values"] for p in again["points"]] == [{"reward/mean": 0.5}]


# ---- trajectories ----------------------------------------------------------------------------


def ids(page: dict[str, Any]) -> list[int]:
    return [item["index"] for item in page["items"]]


def test_trajectory_pages(client: httpx.Client) -> None:
    first = get(client, "/api/runs/a/trajectories", limit=4)
    assert (first["total"], first["matched"], ids(first)) == (10, 10, [0, 1, 2, 3])
    assert first["items"][0] | {"preview": None} == {
        "index": 0, "step": 10, "env_id": "calculator", "task_index": 40, "group_index": 0,
        "status": "ok", "reward": 1.0, "scores": {"correct_answer": 1.0, "used_calculator": 1.0},
        "turns": 2, "tool_calls": 1, "tool_errors": 0, "results_cut": 0, "turns_cut": 0,
        "length": 107, "preview": None,
    }  # fmt: skip
    assert "messages" not in first["items"][0]  # pages carry summaries only
    assert ids(get(client, "/api/runs/a/trajectories", offset=8, limit=4)) == [8, 9]
    too_big = client.get("/api/runs/a/trajectories", params={"limit": 1000})
    assert too_big.status_code == 422 and "less than or equal to 200" in too_big.text


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"max_reward": 0.5}, [6, 7]),
        ({"min_reward": 0.5, "step": 20}, [8, 9]),
        ({"status": ["truncated", "error"]}, [7]),
        ({"tool_errors": True}, [6]),
        ({"length_outliers": True}, [8, 9]),
        ({"results_cut": True}, [2]),
        ({"turns_cut": True}, [7]),
    ],
)
def test_trajectory_filters(
    client: httpx.Client, params: dict[str, Any], expected: list[int]
) -> None:
    page = get(client, "/api/runs/a/trajectories", **params)
    assert (ids(page), page["matched"], page["total"]) == (expected, len(expected), 10)


def test_an_unknown_status_is_refused_with_the_valid_ones(client: httpx.Client) -> None:
    response = client.get("/api/runs/a/trajectories", params={"status": "bogus"})
    assert response.status_code == 422
    assert "'ok', 'truncated', 'error', 'infra_error' or 'late'" in response.text


def test_detail_has_messages_tool_calls_scores_and_loss_mask(
    client: httpx.Client, dashboard: Dashboard
) -> None:
    expected = dashboard.store.runs["a"].trajectories[6]
    detail = get(client, "/api/runs/a/trajectories/6")
    assert detail["messages"] == expected.messages
    assert detail["messages"][2]["tool_calls"][0]["function"]["name"] == "calculate"
    assert detail["messages"][3]["content"].startswith("error: cannot parse")
    assert detail["turns"][0]["tool_errors"] == expected.turns[0].tool_errors
    assert [t["tool_results_cut"] for t in detail["turns"]] == [0, 0]
    cut = get(client, "/api/runs/a/trajectories/2")
    assert [t["tool_results_cut"] for t in cut["turns"]] == [1, 0]
    assert detail["scores"] == {"correct_answer": 0.0, "used_calculator": 1.0}
    ids_, mask, _ = expected.flatten()
    [sequence] = detail["tokens"]["sequences"]
    assert (sequence["ids"], sequence["mask"]) == (ids_, mask)
    assert detail["tokens"]["decoded"] and "".join(sequence["pieces"]) == bytes(ids_).decode()
    missing = client.get("/api/runs/a/trajectories/10")
    assert missing.status_code == 404
    assert missing.json()["detail"] == "run 'a' has 10 trajectories; there is no #10"


def test_detail_without_a_tokenizer_shows_ids(client: httpx.Client) -> None:
    tokens = get(client, "/api/runs/bb/trajectories/0")["tokens"]
    assert not tokens["decoded"] and "pieces" not in tokens["sequences"][0]
    assert tokens["tokenizer"].startswith("no tokenizer.json in the run folder")


def test_detail_decodes_with_the_tiny_models_tokenizer(tmp_path: Path) -> None:
    require("transformers")
    from agentgym.serve._dashboard import token_view

    trajectory = episode(1, 2)  # byte ids: the tiny tokenizer's ids 0-255 are the bytes
    tokens = token_view(trajectory, {"run_dir": str(tmp_path), "config": {"model": "tiny"}})
    assert tokens["tokenizer"] == "tokenizer of tiny (rebuilt)" and tokens["decoded"]
    ids_, _, _ = trajectory.flatten()
    assert "".join(tokens["sequences"][0]["pieces"]) == bytes(ids_).decode()
    unknown = token_view(trajectory, {"run_dir": None, "config": {"model": "tiny:nope"}})
    assert not unknown["decoded"] and "unknown tiny preset" in unknown["tokenizer"]


def test_a_rerendered_history_is_shown_per_turn(tmp_path: Path) -> None:
    from agentgym.serve._dashboard import token_view

    trajectory = episode(1, 2)
    trajectory.turns[1].prompt_ids = [0] + (trajectory.turns[1].prompt_ids or [])
    tokens = token_view(trajectory, {"run_dir": str(tmp_path), "config": {}})
    assert tokens["mode"] == "per_turn" and [s["label"] for s in tokens["sequences"]] == [
        "turn 0", "turn 1"
    ]  # fmt: skip
    first, turn = tokens["sequences"][0], trajectory.turns[0]
    assert first["ids"] == (turn.prompt_ids or []) + (turn.completion_ids or [])
    assert first["mask"] == [0] * len(turn.prompt_ids or []) + (turn.completion_mask or [])


def test_model_output_is_returned_as_data(client: httpx.Client) -> None:
    detail = get(client, "/api/runs/a/trajectories/9")
    assert XSS in detail["messages"][1]["content"]
    page = client.get("/")
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="static/dashboard.js"' in page.text
    script = client.get("/static/dashboard.js")
    assert script.status_code == 200
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script.text  # the page never parses data as HTML or code
    for name in ("dashboard.html", "..%2F_dashboard.py", "nope.js"):
        assert client.get(f"/static/{name}").status_code == 404


# ---- the index -------------------------------------------------------------------------------


def test_index_is_built_once_then_extended_or_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "eval_trajectories.jsonl"
    path.write_text(to_json_line(episode(1, 2)) + "not json\n" + to_json_line(episode(3, 4)))
    cache = IndexCache()
    index = cache.get(path)
    assert [r.task_index for r in index.rows] == [1, 3] and index.bad_lines == 1
    assert cache.get(path) is index and cache.get(path).rows[0] is index.rows[0]

    torn = to_json_line(episode(7, 8))
    with path.open("a") as f:
        f.write(to_json_line(episode(5, 6)) + torn[:30])
    grown = cache.get(path)
    assert [r.task_index for r in grown.rows] == [1, 3, 5]  # the torn line waits
    assert grown.rows[0] is index.rows[0]  # extended, not re-read
    with path.open("a") as f:
        f.write(torn[30:])
    assert [r.task_index for r in cache.get(path).rows] == [1, 3, 5, 7]

    replacement = tmp_path / "new.jsonl"
    replacement.write_text(to_json_line(episode(9, 9)))
    os.replace(replacement, path)  # atomic rewrite (e.g. a resumed run's rollback)
    assert [r.task_index for r in cache.get(path).rows] == [9]


def test_non_finite_values_become_null(tmp_path: Path) -> None:
    from agentgym.serve._dashboard import detail

    trajectory = episode(1, 2)
    trajectory.scores["judge"] = float("nan")
    data = detail(trajectory, 0, {"run_dir": str(tmp_path), "config": {}})
    assert data["scores"]["judge"] is None
    json.dumps(data, allow_nan=False)  # what the JSON response does

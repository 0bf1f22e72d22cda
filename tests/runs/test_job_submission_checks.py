"""Job configs checked at submission by the command's own checks, keys named as its flags.

An eval job could not choose a task range (``tasks`` refused as unknown, ``task_range``
passed as ``--task-range``); values ``agentgym eval`` refuses were queued and failed in the
worker (exit 2); a URL password was stored in the run database and shown by the API; and
``api_key`` read as an option the command lacks. Submission as ``agentgym serve`` (a real
server on loopback, ``POST /jobs``) and ``sweep`` (the console script) make it, into a real
SQLite file; `submit_job` directly where the refusal alone is asked about.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError
from tests.conftest import require
from tests.runs.cli import agentgym

require("sqlalchemy")
from agentgym.runs import RunStore, job_command, submit_job  # noqa: E402

SECRET = "hunter2"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    """An empty SQLite run store in the test's folder."""
    store = RunStore(str(tmp_path / "runs.db"))
    yield store
    store.close()


def refusal(store: RunStore, kind: str, config: dict[str, Any], root: Path) -> str:
    """The one line `submit_job` refuses ``config`` with; nothing may have been stored."""
    with pytest.raises(ConfigError) as refused:
        submit_job(store, kind, config, runs_root=root, source="serve")
    assert store.list_runs() == []
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_an_eval_job_plays_the_task_range_its_tasks_key_names(
    store: RunStore, tmp_path: Path
) -> None:
    config = {"env": "calculator", "tasks": "3:5"}
    run_id = submit_job(store, "eval", config, runs_root=tmp_path / "runs", source="serve")
    out = tmp_path / "runs" / run_id
    command = job_command("eval", config, out, resume=False)
    assert command[command.index("--tasks") + 1] == "3:5"
    played = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env={"AGENTGYM_RUNS_DB": "off", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert played.returncode == 0, played.stderr
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["task_index"] for line in lines) == [3, 4]
    # the Python name is no key: it names the key --help shows
    said = refusal(RunStore(str(tmp_path / "other.db")), "eval",
                   {"env": "calculator", "task_range": "0:5"}, tmp_path / "runs")  # fmt: skip
    assert said == "unknown eval config key 'task_range'; did you mean 'tasks'?"


def test_a_sweep_over_eval_task_ranges_runs_each_range(tmp_path: Path, db: str) -> None:
    config = tmp_path / "ev.yaml"
    config.write_text("env: calculator\n")
    swept = agentgym("sweep", config, "--kind", "eval", "--grid", "tasks=0:1,1:3", "--runs-dir",
                     tmp_path / "runs", db=db)  # fmt: skip
    assert swept.returncode == 0, swept.stdout + swept.stderr
    runs = RunStore(db).list_runs()
    assert {r["status"] for r in runs} == {"finished"}
    played = {r["name"]: len(Path(r["run_dir"], "trajectories.jsonl").read_text().splitlines())
              for r in runs}  # fmt: skip
    assert played == {"ev-tasks=0_1": 1, "ev-tasks=1_3": 2}  # ":" is no character of a name


#: Eval configs `agentgym eval` refuses before any model or server, and the words it uses.
REFUSED_EVALS = [
    ({"policy": "openai", "model": "m", "base_url": "file:///etc/passwd"},
     "base_url (--base-url) must be an http(s) URL"),
    ({"policy": "openai", "model": "m", "base_url": "not a url"},
     "base_url (--base-url) must be an http(s) URL"),
    ({"policy": "openai", "model": "m", "base_url": "http://[::1"},
     "base_url (--base-url) must be an http(s) URL"),
    ({"policy": "openai", "model": "m", "temperature": -5}, "sampling needs a finite temperature"),
    ({"policy": "hf", "model_path": "tiny", "temperature": float("nan")},
     "sampling needs a finite temperature"),
    ({"policy": "hf", "model_path": "tiny", "temperature": float("inf")},
     "sampling needs a finite temperature"),
    ({"policy": "hf", "adapter": "/etc"}, "/etc is not a LoRA adapter"),
    ({"policy": "hf", "model_path": "tiny", "chat_template_kwargs": "{not json"},
     "--chat-template-kwargs must be a JSON object"),
    ({"policy": "vllm", "model_path": "tiny", "server": ["file:///x"]},
     "--server / rollout_servers must be an http(s) URL"),
    ({"env_kwargs": {"num_tasks": 0}}, "num_tasks must be an int >= 1, got 0"),
    ({"env_kwargs": {"num_tasks": 200000}}, "ask for num_tasks <= 24300, got 200000"),
    ({"env_kwargs": {"num_tasks": 5}, "tasks": "0:9"}, "--tasks 0:9 reaches task 8"),
    ({"tasks": "0:2", "num_tasks": 2}, "give tasks START:END or num_tasks N, not both"),
]  # fmt: skip


#: Where a job's refusal names a config key and the command's the option that sets it.
NAMED_AS_FLAGS = {"give tasks START:END or num_tasks N": "give --tasks START:END or -n N"}


def _as_flags(config: dict[str, Any]) -> list[str]:
    """``config`` as `agentgym eval` options, typed as a user would."""
    flags: list[str] = []
    for key, value in config.items():
        if key == "env_kwargs":
            flags += [f"--env-arg={k}={v}" for k, v in value.items()]
        else:
            for item in value if isinstance(value, list) else [value]:
                flags.append(f"--{key.replace('_', '-')}={item}")
    return flags


@pytest.mark.parametrize(("config", "says"), REFUSED_EVALS)
def test_an_eval_config_the_command_refuses_is_refused_at_submission_in_its_words(
    store: RunStore, tmp_path: Path, config: dict[str, Any], says: str
) -> None:
    """Queued, each failed in the worker with exit 2; the command and the job check share it."""
    said = refusal(store, "eval", {"env": "calculator", **config}, tmp_path / "runs")
    assert says in said
    played = agentgym("eval", "calculator", *_as_flags(config), "--out", tmp_path / "cli",
                      db="off")  # fmt: skip
    assert played.returncode == 2, played.stderr
    for job_words, command_words in NAMED_AS_FLAGS.items():  # the job names its keys
        said = said.replace(job_words, command_words)
    assert played.stderr.strip() == f"error: {said}"


@pytest.mark.parametrize(("kwargs", "says"), [({"num_tasks": 0}, "got 0"),
                                              ({"num_tasks": 200000}, "got 200000")])  # fmt: skip
def test_an_sft_jobs_env_options_are_refused_as_the_env_refuses_them(
    store: RunStore, tmp_path: Path, kwargs: dict[str, Any], says: str
) -> None:
    config = {"model": "tiny", "env": "calculator", "env_kwargs": kwargs}
    assert says in refusal(store, "sft", config, tmp_path / "runs")


@pytest.mark.parametrize(
    ("key", "says"),
    [("api_key", "eval config key 'api_key' is refused: a secret is never stored in the run "
                "database; drop it"),
     ("out", "eval config key 'out' is the job's run folder, set by the queue; drop it"),
     ("resume", "eval config key 'resume' is set by the queue"),
     ("env_arg", "eval config key 'env_arg' is written as env_kwargs")],
)  # fmt: skip
def test_a_key_the_queue_keeps_says_why_not_that_it_is_unknown(
    store: RunStore, tmp_path: Path, key: str, says: str
) -> None:
    said = refusal(store, "eval", {"env": "calculator", key: "x"}, tmp_path / "runs")
    assert said.startswith(says) and "unknown" not in said and "valid keys" not in said
    if key == "api_key":  # where the worker really reads it from
        assert "OPENAI_API_KEY" in said and "inherit" in said


# ---- a password in a URL, through the job API ------------------------------------------------

httpx = require("httpx")
require("fastapi")
require("uvicorn")


@pytest.fixture
def api(store: RunStore, tmp_path: Path) -> Iterator[Any]:
    from agentgym.serve import create_app
    from agentgym.serve._thread import serve_in_thread

    app = create_app(store, runs_root=tmp_path / "runs")
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client


@pytest.mark.parametrize(
    ("kind", "config", "says"),
    [("eval", {"env": "calculator", "policy": "openai", "model": "m",
               "base_url": f"http://alice:{SECRET}@127.0.0.1:9/v1"}, "base_url (--base-url)"),
     ("eval", {"env": "calculator", "policy": "vllm", "model_path": "tiny",
               "server": [f"http://alice:{SECRET}@127.0.0.1:9"]}, "--server / rollout_servers"),
     ("eval", {"env": "calculator", "policy": "vllm", "model_path": "tiny",
               "server": ["http://127.0.0.1:9"],
               "router_url": f"http://alice:{SECRET}@127.0.0.1:8"}, "--router-url"),
     ("train", {"env": "calculator", "model": "tiny",
                "rollout_servers": [f"http://bob:{SECRET}@127.0.0.1:9"]}, "rollout_servers"),
     ("train", {"env": "calculator", "model": "tiny", "rollout_servers": ["http://127.0.0.1:9"],
                "rollout_router_url": f"http://bob:{SECRET}@127.0.0.1:8"}, "rollout_router_url")],
)  # fmt: skip
def test_a_url_with_a_password_is_refused_never_stored_nor_echoed(
    api: Any, store: RunStore, kind: str, config: dict[str, Any], says: str
) -> None:
    if kind == "train":
        require("torch")  # GRPOConfig's module: without it the worker is left to refuse
    response = api.post("/jobs", json={"kind": kind, "config": config})
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert detail.startswith(says) and "user:password@" in detail
    assert SECRET not in response.text
    assert store.list_runs() == [] and SECRET not in api.get("/jobs").text

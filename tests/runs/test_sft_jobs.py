"""``agentgym sft`` as a job kind of the run queue, beside ``train`` and ``eval``.

Checked at submission by the command's own parser (a bad config is one line and no row), run by
the queue's worker with the run folder as OUT, and, once SIGKILLed after a checkpoint exists,
retried with ``--resume`` from that checkpoint (``<run folder>.partial/``). Real ``agentgym sft``
worker processes on the tiny model and the calculator env; the queue runs in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.runs.cli import agentgym

require("sqlalchemy")
require("torch")
from agentgym._errors import ConfigError  # noqa: E402
from agentgym.runs import TERMINAL, JobQueue, RunStore, job_command, submit_job  # noqa: E402
from agentgym.runs._folder import has_checkpoint, sft_checkpoint  # noqa: E402

#: Optimiser steps of the killed job, and its checkpoints' spacing: the kill comes once the first
#: checkpoint exists (polled every 20 ms), with 10 steps (seconds, even on two idle cores) left
#: to land in. More steps only lengthen the retry.
STEPS, SAVE_EVERY = 12, 2
DEADLINE_S = 240


def sft_config(model: Path, **changes: Any) -> dict[str, Any]:
    """A small sft job config on the calculator env (a few seconds of training on CPU)."""
    return {"model": str(model), "env": "calculator", "env_kwargs": {"num_tasks": 24},
            "tasks": "0:8", "steps": STEPS, "batch_size": 4, "save_every": SAVE_EVERY,
            **changes}  # fmt: skip


def wait_for(condition: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
    """Poll ``condition`` until it is truthy (returned); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling with a deadline, not a synchronisation sleep
    return value


# ---- submission -------------------------------------------------------------------------------


def test_an_sft_job_is_checked_at_submission_and_a_bad_one_never_becomes_a_run(
    tmp_path: Path,
) -> None:
    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    good = sft_config(Path("tiny"))
    refusals = {
        "unknown sft config key 'step'; did you mean 'steps'?": {**good, "step": 3},
        "Invalid value for '--steps'": {**good, "steps": "many"},
        "'qlora' is not one of 'full', 'lora'": {**good, "method": "qlora"},
        "unknown env 'nope'": {**good, "env": "nope"},
        "got neither of --env and --trajectories": {"model": "tiny"},
        "--min-reward filters --trajectories": {**good, "min_reward": 0.5},
        "--steps must be >= 1, got 0": {**good, "steps": 0},  # named as the option
        "needs 'model'": {"env": "calculator"},
        "sft config key 'out' is the job's run folder, set by the queue":
            {**good, "out": str(tmp_path / "elsewhere")},
        "sft config key 'resume' is set by the queue": {**good, "resume": True},
        "env_kwargs must be a mapping": {**good, "env_kwargs": ["num_tasks=24"]},
        # files the worker would open later, on this machine: checked now
        f"sft job model: {tmp_path / 'sfx'} is not a model folder (no config.json)":
            {**good, "model": str(tmp_path / "sfx")},
        "sft job model: unknown tiny model preset 'quickstat'": {**good, "model": "tiny:quickstat"},
        f"sft job trajectories: {tmp_path / 'ep.jsonl'} does not exist (from {Path.cwd()}":
            {"model": "tiny", "trajectories": [str(tmp_path / "ep.jsonl")]},
    }
    for reason, config in refusals.items():
        with pytest.raises(ConfigError) as refused:
            submit_job(store, "sft", config, runs_root=tmp_path / "runs", source="serve")
        assert reason in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert store.list_runs() == [] and not (tmp_path / "runs").exists()
    run_id = submit_job(store, "sft", "model: tiny\nenv: calculator\nsteps: 3",
                        runs_root=tmp_path / "runs", source="serve")  # fmt: skip
    row = store.get_run(run_id)
    assert row is not None
    assert (row["kind"], row["status"], row["name"]) == ("sft", "queued", "sft-calculator")
    assert row["job"] == {"kind": "sft", "config": {"model": "tiny", "env": "calculator",
                                                    "steps": 3}}  # fmt: skip


def test_the_http_api_queues_an_sft_job_and_refuses_a_bad_one_in_one_line(
    tmp_path: Path,
) -> None:
    require("fastapi")
    from fastapi.testclient import TestClient

    from agentgym.serve import create_app

    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    app = create_app(store, runs_root=tmp_path / "runs")  # not entered: the queue does not run
    client = TestClient(app, base_url="http://127.0.0.1:8765")
    bad = client.post("/jobs", json={"kind": "sft", "config": {"model": "tiny", "env": "calc",
                                                                "steps": "x"}})  # fmt: skip
    assert bad.status_code == 400, bad.text
    assert "\n" not in bad.json()["detail"] and store.list_runs() == []
    queued = client.post("/jobs", json={"kind": "sft", "config": sft_config(Path("tiny"))})
    assert queued.status_code == 201, queued.text
    assert (queued.json()["kind"], queued.json()["status"]) == ("sft", "queued")
    assert client.get("/jobs?status=queued").json()[0]["id"] == queued.json()["id"]


def test_the_worker_runs_sft_with_the_run_folder_as_out_and_resume_on_a_retry(
    tmp_path: Path,
) -> None:
    config = sft_config(Path("/models/m"), trajectories=["a.jsonl", "b.jsonl"], env=None,
                        tasks=None, min_reward=0.5, chat_template_kwargs={"x": False})  # fmt: skip
    argv = job_command("sft", config, tmp_path, resume=True)
    # MODEL OUT last, after "--": a model named like an option stays the model
    assert argv[-4:] == ["--resume", "--", "/models/m", str(tmp_path)]
    assert argv.count("--trajectories") == 2 and "--env" not in argv
    assert argv.count("--env-arg") == 1 and "num_tasks=24" in argv
    assert json.loads(argv[argv.index("--chat-template-kwargs") + 1]) == {"x": False}
    assert "--resume" not in job_command("sft", config, tmp_path, resume=False)


# ---- a queue stopped mid-job ------------------------------------------------------------------


def test_an_interrupted_sft_job_is_requeued_only_with_a_checkpoint(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    ids = [submit_job(store, "sft", sft_config(Path("tiny")), runs_root=tmp_path / "runs",
                      source="serve") for _ in range(2)]  # fmt: skip
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is now free: the queue that ran both jobs is gone
    for _ in ids:
        assert store.claim_next(f"{socket.gethostname()}:{dead.pid}") is not None
    with_checkpoint, without = (Path(store.get_run(i)["run_dir"]) for i in ids)  # type: ignore[index]
    for folder in (with_checkpoint, without):
        folder.mkdir(parents=True)
        (folder / "output.log").write_text("--- attempt 1\n")
    assert not has_checkpoint("sft", with_checkpoint)
    sft_checkpoint(with_checkpoint).parent.mkdir()
    sft_checkpoint(with_checkpoint).write_bytes(b"state")
    assert has_checkpoint("sft", with_checkpoint)
    assert JobQueue(store).recover() == [ids[0]]
    requeued, kept = (store.get_run(i) for i in ids)
    assert requeued is not None and kept is not None
    assert (requeued["status"], requeued["resume"]) == ("queued", True)
    assert kept["status"] == "interrupted" and "no checkpoint to resume" in kept["error_tail"]


# ---- a worker SIGKILLed mid-job, retried -------------------------------------------------------


class KilledJob:
    """An sft job the queue ran, whose first worker was SIGKILLed after a checkpoint existed."""

    def __init__(self, store: RunStore, run_id: str, checkpoint: dict[str, Any]) -> None:
        self.store, self.run_id, self.checkpoint = store, run_id, checkpoint
        row = store.get_run(run_id)
        assert row is not None
        self.row, self.run_dir = row, Path(row["run_dir"])


@pytest.fixture(scope="module")
def killed_job(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> KilledJob:
    """Submit, run, SIGKILL the worker at its first checkpoint, let the retry finish."""
    import torch

    root = tmp_path_factory.mktemp("sft-job")
    store = RunStore(f"sqlite:///{root / 'runs.db'}")
    run_id = submit_job(store, "sft", sft_config(tiny_model_dir), runs_root=root / "runs",
                        source="serve", name="warm")  # fmt: skip
    run_dir = root / "runs" / run_id
    def first_checkpoint() -> int | None:
        """The first worker's pid once it saved a checkpoint; fails if the job ended first."""
        row = store.get_run(run_id)
        assert row is not None
        if row["status"] in TERMINAL:
            pytest.fail(f"the job ended before a checkpoint: {row['error_tail']}")
        return row["pid"] if sft_checkpoint(run_dir).is_file() and row["attempt"] == 1 else None

    with _queue_running(store):
        pid = wait_for(first_checkpoint, "a checkpoint of the first attempt")
        os.kill(pid, signal.SIGKILL)
        # a killed process writes nothing more, and the retry saves only after its imports
        # and a step: this copy is the state the killed worker left
        shutil.copyfile(sft_checkpoint(run_dir), root / "killed-state.pt")
        wait_for(lambda: store.get_run(run_id)["status"] in ("finished", "failed"),  # type: ignore[index]
                 "the retry to end")  # fmt: skip
    state = torch.load(root / "killed-state.pt", weights_only=True)
    return KilledJob(store, run_id, state)


@contextlib.contextmanager
def _queue_running(store: RunStore) -> Iterator[JobQueue]:
    """A `JobQueue` on ``store`` in a thread of its own; on leaving, wait until it is idle."""
    queue = JobQueue(store, workers=1, poll_s=0.05)
    thread = threading.Thread(target=lambda: asyncio.run(queue.run(until_idle=True)), daemon=True)
    thread.start()
    yield queue
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the queue is still running jobs"


def test_a_killed_sft_job_resumes_from_its_checkpoint_and_finishes(killed_job: KilledJob) -> None:
    row, run_dir, state = killed_job.row, killed_job.run_dir, killed_job.checkpoint
    assert (row["status"], row["exit_code"], row["attempt"], row["resume"]) == (
        "finished", 0, 2, True,
    ), row["error_tail"]  # fmt: skip
    killed_at = state["step"]
    assert 0 < killed_at < STEPS and killed_at % SAVE_EVERY == 0
    log = " ".join((run_dir / "output.log").read_text().split())  # rich wraps long lines
    assert "--- attempt 2" in log and "sft resumed from" in log, log[-3000:]
    history = json.loads((run_dir / "sft.json").read_text())["history"]
    assert [r["step"] for r in history] == list(range(1, STEPS + 1))  # none twice, none lost
    # the steps before the kill are the checkpoint's records, timings included: continued
    assert history[:killed_at] == state["history"]
    assert (run_dir / "model.safetensors").is_file()
    assert not sft_checkpoint(run_dir).parent.exists()  # removed once the model is saved


def test_a_finished_sft_job_is_listed_like_the_other_kinds(
    killed_job: KilledJob, tmp_path: Path
) -> None:
    require("fastapi")
    from fastapi.testclient import TestClient

    from agentgym.serve import create_app

    history = json.loads((killed_job.run_dir / "sft.json").read_text())["history"]
    row = killed_job.row
    assert (row["kind"], row["name"], row["step"]) == ("sft", "warm", STEPS)
    assert row["figures"]["sft/loss"] == pytest.approx(history[-1]["loss"])
    assert row["config"]["source"] == "env" and row["config"]["steps"] == STEPS
    listed = agentgym("runs", "ls", db=killed_job.store.url)
    assert listed.returncode == 0, listed.stderr
    [line] = [line for line in listed.stdout.splitlines() if killed_job.run_id in line]
    assert "sft" in line and "warm" in line and "finished" in line and "sft/loss=" in line
    app = create_app(killed_job.store, runs_root=tmp_path)
    client = TestClient(app, base_url="http://127.0.0.1:8765")
    job = client.get(f"/jobs/{killed_job.run_id}").json()
    assert (job["kind"], job["status"], job["attempt"]) == ("sft", "finished", 2)
    [shown] = [r for r in client.get("/api/runs").json()["runs"] if r["id"] == killed_job.run_id]
    assert (shown["kind"], shown["step"]) == ("sft", STEPS) and "sft/loss" in shown["figures"]
    assert "--- attempt 2" in client.get(f"/jobs/{killed_job.run_id}/logs").text

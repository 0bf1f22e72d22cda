"""Jobs the queue cannot start, and config shapes the job command must pass on intact."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentgym.runs import JobQueue, RunStore, job_command, submit_job


def test_a_job_whose_process_cannot_start_fails_with_the_reason(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "runs.db"))  # closed by the conftest's autouse fixture
    # one argument over Linux's 128 KiB per-argument limit: exec fails with E2BIG
    config = {"env": "calculator", "num_tasks": 1, "env_kwargs": {"pad": "x" * 200_000}}
    run_id = submit_job(store, "eval", config, runs_root=tmp_path / "runs", source="serve")
    asyncio.run(asyncio.wait_for(JobQueue(store, poll_s=0.05).run(until_idle=True), 60))
    row = store.get_run(run_id)
    assert row is not None and row["status"] == "failed", row
    assert "could not be started" in row["error_tail"]


def test_a_list_option_is_repeated_not_stringified(tmp_path: Path) -> None:
    config = {"env": "calculator", "policy": "vllm", "server": ["http://a:1", "http://b:2"]}
    argv = job_command("eval", config, tmp_path, resume=False)
    assert argv.count("--server") == 2 and "http://b:2" in argv
    assert not any(arg.startswith("[") for arg in argv)

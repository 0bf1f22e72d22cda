"""Jobs the queue cannot start, and config shapes the job command must pass on intact."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from agentgym import ConfigError
from agentgym.runs import JobQueue, RunStore, job_command, submit_job


def test_a_job_whose_process_cannot_start_fails_with_the_reason(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "runs.db"))  # closed by the conftest's autouse fixture
    # one argument over Linux's 128 KiB per-argument limit: exec fails with E2BIG
    config = {"env": "calculator", "num_tasks": 1, "env_kwargs": {"system_prompt": "x" * 200_000}}
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


EXITS_ON_IMPORT = "import sys\nsys.exit(2)\n"
REGISTERS = '''
import agentgym
from agentgym.envs.calculator import CalculatorEnv

agentgym.register("jobs/Calc-v0", CalculatorEnv)
'''


def test_a_module_env_is_imported_in_a_child_not_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked in the server's process, a module that exits on import (``unittest.__main__``)
    stopped the server, and any module's code ran inside it."""
    monkeypatch.chdir(tmp_path)  # where a user's env modules are found
    (tmp_path / "exits_on_import.py").write_text(EXITS_ON_IMPORT)
    (tmp_path / "my_calc.py").write_text(REGISTERS)
    store = RunStore(str(tmp_path / "runs.db"))
    for kind, config in (("eval", {"env": "exits_on_import:x"}),
                         ("train", {"env": "exits_on_import:x"}),
                         ("sft", {"model": "tiny", "env": "exits_on_import:x"})):  # fmt: skip
        with pytest.raises(ConfigError, match=r"env 'exits_on_import:x': exit 2"):
            submit_job(store, kind, config, runs_root=tmp_path / "runs", source="serve")
    assert "exits_on_import" not in sys.modules and "my_calc" not in sys.modules
    with pytest.raises(ConfigError, match=r"does not take option\(s\) \['bogus'\]"):
        submit_job(store, "eval", {"env": "my_calc:jobs/Calc-v0", "env_kwargs": {"bogus": 1}},
                   runs_root=tmp_path / "runs", source="serve")  # fmt: skip
    queued = submit_job(store, "eval", {"env": "my_calc:jobs/Calc-v0", "num_tasks": 1},
                        runs_root=tmp_path / "runs", source="serve")  # fmt: skip
    assert store.get_run(queued)["status"] == "queued"  # type: ignore[index]
    assert "my_calc" not in sys.modules


def test_env_options_are_checked_when_the_job_is_queued(tmp_path: Path) -> None:
    """It was queued, took a worker, and failed there with exit 2."""
    store = RunStore(str(tmp_path / "runs.db"))
    with pytest.raises(ConfigError, match=r"Calculator-v0 does not take option\(s\) \['bogus'\]"):
        submit_job(store, "eval", {"env": "calculator", "env_kwargs": {"bogus": 1}},
                   runs_root=tmp_path / "runs", source="serve")  # fmt: skip
    assert store.list_runs() == []

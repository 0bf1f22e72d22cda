"""Job configs refused at submission as their command would refuse them, a database newer than
the code, and a run folder name the file system cannot hold: each one line, exit 2.

Submission as ``agentgym serve`` (``POST /jobs``) and ``sweep`` make it (`submit_job`), into a
real SQLite file; the CLI cases run the console script.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError
from agentgym._durable import check_folder_can_be_made
from tests.conftest import require
from tests.runs.cli import agentgym

require("sqlalchemy")
from agentgym.runs import RunStore, job_command, submit_job  # noqa: E402

MODULE_ENV = """
import agentgym
from agentgym.envs.calculator import CalculatorEnv

agentgym.register("probe/Calc-v0", CalculatorEnv)
print("a module that prints on import")
"""


def submitted(store: RunStore, kind: str, config: dict[str, Any], root: Path) -> str:
    return submit_job(store, kind, config, runs_root=root, source="serve")


@pytest.mark.parametrize(
    ("kind", "config", "says"),
    [
        # no model to play: the command refused it in its first second, after a worker started
        ("eval", {"env": "calculator", "policy": "vllm"}, "--policy vllm needs --model-path"),
        ("eval", {"env": "calculator", "policy": "hf"}, "--policy hf needs --model-path"),
        # task ranges past the env's last task (calculator: 100 tasks; here 5)
        ("sft", {"model": "tiny", "env": "calculator", "tasks": "0:99999"},
         "--tasks 0:99999 reaches task 99998 but 'calculator' has 100 tasks"),
        ("sft", {"model": "tiny", "env": "probe_env:probe/Calc-v0", "tasks": "0:101"},
         "reaches task 100 but 'probe_env:probe/Calc-v0' has 100 tasks"),  # counted in a child
        ("train", {"model": "tiny", "env": "calculator", "env_kwargs": {"num_tasks": 5},
                   "train_tasks": "0:100", "rollout_engine": "hf"},
         "reach task 99 but 'calculator' has 5 tasks"),
        # a list for an option of one value: click kept the last item
        ("eval", {"env": "calculator", "group_size": [4, 2]},
         "eval config key 'group_size' takes one value, got [4, 2]; use agentgym sweep --grid"),
        ("sft", {"model": "tiny", "env": "calculator", "steps": [1, 2]},
         "sft config key 'steps' takes one value"),
    ],
)  # fmt: skip
def test_a_config_its_command_refuses_at_once_is_refused_at_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, config: dict[str, Any], says: str
) -> None:
    monkeypatch.chdir(tmp_path)  # where the job's worker (and the env check) finds modules
    (tmp_path / "probe_env.py").write_text(MODULE_ENV)
    store = RunStore(str(tmp_path / "runs.db"))
    with pytest.raises(ConfigError) as refused:
        submitted(store, kind, config, tmp_path / "runs")
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert store.list_runs() == []


def test_the_configs_beside_those_are_still_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "probe_env.py").write_text(MODULE_ENV)
    store = RunStore(str(tmp_path / "runs.db"))
    for kind, config in (
        ("eval", {"env": "calculator", "policy": "vllm", "model_path": "tiny"}),
        ("sft", {"model": "tiny", "env": "calculator", "tasks": "0:100"}),
        ("sft", {"model": "tiny", "env": "probe_env:probe/Calc-v0", "tasks": "90:100"}),
        ("sft", {"model": "tiny", "trajectories": [str(tmp_path)]}),  # takes several
        ("train", {"model": "tiny", "env": "calculator", "env_kwargs": {"num_tasks": 50},
                   "train_tasks": "0:40", "rollout_engine": "hf"}),
    ):  # fmt: skip
        submitted(store, kind, config, tmp_path / "runs")
    assert len(store.list_runs()) == 5


def test_the_job_command_refuses_a_list_for_one_value_too(tmp_path: Path) -> None:
    """A row queued before the check (an older server) must not run with the last item."""
    with pytest.raises(ConfigError, match="'num_tasks' takes one value"):
        job_command("eval", {"env": "calculator", "num_tasks": [1, 50]}, tmp_path, resume=False)


def test_a_database_newer_than_the_code_is_one_line_naming_the_upgrade(tmp_path: Path) -> None:
    """It was a RuntimeError traceback (exit 1) from every command opening the database."""
    path = tmp_path / "runs.db"
    RunStore(str(path)).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(ConfigError, match=r"schema version 99, newer than .* upgrade agentgym"):
        RunStore(str(path))
    listed = agentgym("runs", "ls", db=str(path))
    assert listed.returncode == 2 and "Traceback" not in listed.stderr, listed.stderr
    assert listed.stderr.startswith("error: ") and "upgrade agentgym" in listed.stderr
    assert len(listed.stderr.strip().splitlines()) == 1


def test_a_run_folder_name_over_the_file_systems_limit_is_refused_naming_the_option(
    tmp_path: Path,
) -> None:
    """The check meant to refuse bad folders raised OSError (ENAMETOOLONG): a traceback."""
    too_long = tmp_path / ("y" * 300)
    with pytest.raises(ConfigError, match=r"^--out .*: File name too long; choose another --out"):
        check_folder_can_be_made(too_long / "run", "--out")
    played = agentgym("eval", "calculator", "-n", "1", "--out", str(too_long), db="off")
    assert played.returncode == 2 and "Traceback" not in played.stderr, played.stderr
    assert played.stderr.startswith("error: --out ") and "choose another --out" in played.stderr

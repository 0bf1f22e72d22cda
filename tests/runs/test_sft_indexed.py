"""``agentgym sft`` as an indexed run: its row, status, figures and refusals in the run store.

The real console script on the tiny model and the calculator env, each test with a database of
its own (``AGENTGYM_RUNS_DB``), so nothing reaches the user's ``runs.db``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import require
from tests.runs.cli import agentgym

require("sqlalchemy")
from agentgym.runs import RunStore  # noqa: E402
from agentgym.runs._folder import read_figures, read_step  # noqa: E402

FAST = ["--steps", "3", "--batch-size", "4", "--env-arg", "num_tasks=24"]


def test_an_sft_run_is_listed_finished_with_its_loss(
    tiny_model_dir: Path, tmp_path: Path, db: str
) -> None:
    out = tmp_path / "warm"
    done = agentgym("sft", tiny_model_dir, out, "--env", "calculator", "--tasks", "0:8", *FAST,
                    db=db)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [run] = RunStore(db).list_runs()
    assert (run["kind"], run["name"], run["status"], run["exit_code"], run["step"]) == (
        "sft", "warm", "finished", 0, 3,
    )  # fmt: skip
    assert run["run_dir"] == str(out.resolve())
    history = json.loads((out / "sft.json").read_text())["history"]
    assert run["figures"]["sft/loss"] == pytest.approx(history[-1]["loss"])
    assert run["figures"]["sft/first_loss"] == pytest.approx(history[0]["loss"])
    assert run["figures"]["sft/traces"] == 8
    assert run["config"]["env"] == "agentgym/Calculator-v0" and run["config"]["steps"] == 3
    assert run["config"]["source"] == "env" and run["config"]["tasks"] == "0:8"
    listed = agentgym("runs", "ls", db=db)
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if run["id"] in line]
    assert "sft" in row and "finished" in row and "sft/loss=" in row
    shown = agentgym("runs", "show", out, db=db)  # by its folder, as a train or eval run
    assert shown.returncode == 0, shown.stderr
    assert "sft/traces" in shown.stdout and "source: env" in shown.stdout


def test_sft_on_an_eval_s_trajectories_records_the_episodes_it_kept(
    tiny_model_dir: Path, tmp_path: Path, db: str
) -> None:
    recorded = tmp_path / "oracle"
    played = agentgym("eval", "calculator", "-n", "4", "--env-arg", "num_tasks=24",
                      "--out", recorded, db=db)  # fmt: skip
    assert played.returncode == 0, played.stderr
    out = tmp_path / "distilled"
    done = agentgym("sft", tiny_model_dir, out, "--trajectories",
                    recorded / "trajectories.jsonl", *FAST, db=db)  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = {run["kind"]: run for run in RunStore(db).list_runs()}
    assert runs.keys() == {"eval", "sft"}
    sft = runs["sft"]
    assert sft["status"] == "finished" and sft["name"] == "distilled"
    assert sft["figures"]["sft/episodes_read"] == 4 and sft["figures"]["sft/episodes_kept"] == 4
    assert sft["config"]["source"] == "trajectories" and sft["config"]["min_reward"] is None
    assert sft["config"]["trajectories"] == [str(recorded / "trajectories.jsonl")]


def test_a_refused_command_line_leaves_no_row_a_refused_trace_a_failed_one(
    tiny_model_dir: Path, tmp_path: Path, db: str
) -> None:
    out = tmp_path / "sft"
    refused = agentgym("sft", tiny_model_dir, out, "--env", "calculator", "--tasks", "0:99",
                       *FAST, db=db)  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert RunStore(db).list_runs() == [] and not out.exists()
    # the trace check is the training's own, after the row is made (as eval's late refusals)
    too_long = agentgym("sft", tiny_model_dir, out, "--env", "calculator", "--tasks", "0:4",
                        "--max-length", "8", *FAST, db=db)  # fmt: skip
    assert too_long.returncode == 2 and "Traceback" not in too_long.stderr, too_long.stderr
    assert not out.exists()
    [run] = RunStore(db).list_runs()
    assert (run["kind"], run["status"], run["exit_code"], run["figures"]) == (
        "sft", "failed", 2, {},
    )  # fmt: skip
    assert run["error_tail"].startswith("ConfigError:") and "max_length" in run["error_tail"]


def test_a_half_written_sft_json_gives_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "sft.json").write_text(
        json.dumps({"num_examples": 5, "history": [{"step": 1, "loss": 2.0}, "junk"]})
    )
    assert read_figures(tmp_path) == {"sft/first_loss": 2.0, "sft/loss": 2.0, "sft/traces": 5}
    assert read_step(tmp_path) == 1
    (tmp_path / "sft.json").write_text('{"history": [{"st')
    assert read_figures(tmp_path) == {} and read_step(tmp_path) is None

"""`agentgym eval --adapter RUN` plays its episodes as the run did, from any working folder.

The README's command (`agentgym eval calculator --policy vllm --adapter runs/quickstart -n
100`) scored the quickstart's adapter 0% where its run measured 92%: the eval played under the
env's default system prompt, turn limit and token budget, and from another folder it could
not find the run's SFT base at all (recorded relative to where the run was started).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import agentgym_here
from tests.trainers.test_export import write_run


def test_a_run_started_with_a_relative_output_dir_finds_its_base_from_elsewhere(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentgym.trainers import export_run
    from agentgym.trainers._export import trained_adapter

    work = tmp_path / "work"
    shutil.copytree(tiny_model_dir, work / "runs" / "run" / "sft")  # the run's SFT base
    monkeypatch.chdir(work)
    run_dir = write_run(Path("runs"), Path("runs/run/sft"), {1: 0})  # records runs/run/sft
    recorded = json.loads((run_dir / "checkpoints/step-000001/adapter/adapter_config.json")
                          .read_text())["base_model_name_or_path"]  # fmt: skip
    assert recorded == "runs/run/sft"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    _, base = trained_adapter(work / "runs" / "run")
    assert base == (work / "runs" / "run" / "sft").resolve()  # was "runs/run/sft is gone"
    monkeypatch.chdir(work)
    exported = export_run(Path("runs/run"), tmp_path / "exported")  # its own folder
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert trained_adapter(exported) == (exported, base)


def test_eval_of_a_runs_adapter_plays_with_the_runs_settings_unless_told_otherwise(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    run_dir = write_run(tmp_path, tiny_model_dir, {1: 0})
    (run_dir / "config.yaml").write_text(
        f"model: {tiny_model_dir}\nenv: calculator\n"
        "env_kwargs: {system_prompt: Answer with the number., num_tasks: 10}\n"
        "max_turns: 2\nmax_completion_length: 7\nmax_model_len: 1024\n"
    )
    out = tmp_path / "eval"
    proc = agentgym_here("eval", "calculator", "--policy", "hf", "--adapter", str(run_dir),
                         "-n", "1", "--env-arg", "num_tasks=5", "--max-model-len", "900",
                         "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"playing as run {run_dir.resolve()} did" in " ".join(proc.stderr.split())
    played = json.loads((out / "run.json").read_text())
    assert played["env_kwargs"] == {  # the run's, key by key, where --env-arg gave none
        "system_prompt": "Answer with the number.", "num_tasks": 5, "max_turns": 2,
    }  # fmt: skip
    assert played["max_tokens"] == 7  # the run's tokens per turn
    assert played["max_model_len"] == 900  # typed: the command line wins
    [episode] = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert episode["messages"][0]["content"] == "Answer with the number."


def test_an_exported_adapter_plays_as_its_run_did_on_its_held_out_tasks(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """An export (`agentgym export RUN OUT`) played under the env's defaults: 0% where its
    run measured 100%. And `--adapter RUN` alone named the run's held-out tasks, then played
    every task, training ones too."""
    from agentgym.trainers import export_run

    run_dir = write_run(tmp_path, tiny_model_dir, {1: 0})
    (run_dir / "config.yaml").write_text(
        f"model: {tiny_model_dir}\nenv: calculator\n"
        "env_kwargs: {system_prompt: Answer with the number., num_tasks: 10}\n"
        "train_tasks: '4:10'\neval_tasks: '2:4'\ntasks_per_step: 2\neval_num_tasks: 2\n"
        "max_turns: 1\nmax_completion_length: 4\nmax_model_len: 1024\n"
    )
    exported = export_run(run_dir, tmp_path / "exported")
    out = tmp_path / "eval"
    proc = agentgym_here("eval", "calculator", "--policy", "hf", "--adapter", str(exported),
                         "--out", str(out))  # fmt: skip
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 0, proc.stderr
    assert f"playing as run {run_dir.resolve()} did" in said
    assert "playing its held-out tasks 2:4 (--tasks or -n to choose others)" in said
    played = json.loads((out / "run.json").read_text())
    assert played["env_kwargs"]["system_prompt"] == "Answer with the number."
    assert played["tasks"] == "2:4"
    episodes = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [e["task_index"] for e in episodes] == [2, 3]

    shutil.rmtree(run_dir)  # the run is gone: said, not silently defaulted
    # said before any episode: one turn of 4 tokens, not the env's default budget, to play
    proc = agentgym_here("eval", "calculator", "--policy", "hf", "--adapter", str(exported),
                         "-n", "1", "--max-tokens", "4", "--env-arg", "max_turns=1",
                         "--out", str(tmp_path / "eval2"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"was exported from run {run_dir.resolve()}, which is gone: the settings it played " \
        "with (env options, tokens per turn) are not used" in " ".join(proc.stderr.split())

"""Which engine a warm-started run's base-model eval plays on.

On the CPU with an in-process vLLM engine, the run's own engine plays it and then takes the
warm start's weights in place (tests/trainers/test_family_training_journey.py checks that path
through the CLI, token for token). Everywhere else (here: ``rollout_engine: hf``) the base model
gets an engine of its own, closed before the warm start trains: this file checks that path still
evaluates the base model, then rolls out on the warm start's weights.
"""

from __future__ import annotations

from pathlib import Path

from agentgym.trainers import GRPOConfig, GRPOTrainer
from agentgym.trainers._run_dir import read_jsonl_records
from tests.conftest import TINY_RUN


def test_a_warm_started_run_on_transformers_evaluates_the_base_on_an_engine_of_its_own(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    config = GRPOConfig(**{**TINY_RUN, "rollout_engine": "hf", "sft_steps": 4, "sft_num_traces": 4,
                           "max_steps": 1, "eval_steps": None, "output_dir": str(run)})  # fmt: skip
    figures = GRPOTrainer(config).train()
    assert {"base/success", "sft/success", "grpo/success"} <= figures.keys()
    played = read_jsonl_records(run / "eval_trajectories.jsonl")
    assert [t["info"]["eval"] for t in played].count("base") == 4  # every held-out task
    assert "in place" not in (run / "train.log").read_text()
    steps = [m for m in read_jsonl_records(run / "metrics.jsonl") if "data/tasks" in m]
    assert len(steps) == 1 and (run / "sft" / "sft.json").is_file()

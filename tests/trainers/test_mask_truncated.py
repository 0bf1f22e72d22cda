"""`mask_truncated_completions`: episodes cut off by the token budget give no samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.trainers import GRPOConfig
from tests.conftest import TINY_RUN


@pytest.mark.slow
def test_truncated_episodes_leave_the_loss_and_the_rest_train(tmp_path: Path) -> None:
    from agentgym.trainers import GRPOTrainer

    # a 3-token budget truncates the random tiny model's episodes unless it ends a turn first
    cfg = GRPOConfig.from_dict({
        **TINY_RUN, "output_dir": str(tmp_path / "run"), "rollout_engine": "hf",
        "max_steps": 1, "eval_steps": None, "save_steps": None, "eval_num_tasks": 1,
        "max_episode_tokens": 3, "mask_truncated_completions": True, "rollout_mode": "concat",
    })  # fmt: skip
    GRPOTrainer(cfg).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    [row] = [r for r in rows if "data/tasks" in r]
    masked = row["rollout/masked_truncated_episodes"]
    assert masked > 0  # else the mask had nothing to do
    # one concat sample per other episode
    assert row["train/samples"] == row["rollout/episodes"] - masked

"""`resample_zero_variance_groups`: flat groups are played again, once, on other train tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym import Trajectory
from agentgym.trainers import GRPOConfig
from agentgym.trainers._grpo import swap_groups
from tests.conftest import TINY_RUN


def episode(position: int, group: int, reward: float, task: int) -> Trajectory:
    return Trajectory(
        env_id="e", task_index=task, task_position=position, group_index=group,
        final_reward=reward,
    )  # fmt: skip


def test_a_replayed_group_takes_the_flat_groups_place_and_key() -> None:
    step = [episode(0, 0, 1.0, 7), episode(0, 1, 0.0, 7), episode(1, 0, 0.0, 9),
            episode(1, 1, 0.0, 9)]  # fmt: skip
    replays = [episode(0, 0, 1.0, 20), episode(0, 1, 0.0, 20)]  # the replay's own plan
    out = swap_groups(step, {1: 0}, replays)
    assert [(t.task_index, t.task_position) for t in out] == [(7, 0), (7, 0), (20, 1), (20, 1)]


@pytest.mark.slow
def test_a_step_of_flat_groups_replays_them_on_tasks_it_did_not_draw(tmp_path: Path) -> None:
    from agentgym.trainers import GRPOTrainer

    # the random tiny model never answers a calculator task: every group is flat (reward 0)
    cfg = GRPOConfig.from_dict({
        **TINY_RUN, "output_dir": str(tmp_path / "run"), "rollout_engine": "hf",
        "max_steps": 1, "eval_steps": None, "save_steps": None, "eval_num_tasks": 1,
        "resample_zero_variance_groups": True,
    })  # fmt: skip
    GRPOTrainer(cfg).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    [row] = [r for r in rows if "data/tasks" in r]  # the one GRPO step (evals log apart)
    drawn, replayed = row["data/tasks"], row["data/replayed_tasks"]
    assert len(replayed) == 2 and not set(replayed) & set(drawn)
    assert all(10 <= t < 40 for t in replayed)  # train tasks (TINY_RUN: 10:40), not eval ones
    assert row["reward/zero_variance_groups"] == 2.0  # still flat after the replay: reported

"""The data order: which train tasks each step plays (a pure function of seed and step)."""

from __future__ import annotations

from typing import Any

from agentgym.trainers import GRPOConfig


def trainer(**knobs: Any) -> Any:
    from agentgym.trainers import GRPOTrainer  # builds the env and the tiny model, no engine

    return GRPOTrainer(GRPOConfig(env="calculator", train_tasks=[7, 3, 5, 11], eval_tasks="0:2",
                                  tasks_per_step=3, report_to=["none"], **knobs))  # fmt: skip


def test_each_pass_plays_every_train_task_once_in_a_seeded_shuffle() -> None:
    steps = [trainer(seed=1)._tasks_for(s) for s in (1, 2, 3, 4)]
    played = sum(steps, [])
    assert sorted(played[:4]) == sorted(played[4:8]) == sorted(played[8:]) == [3, 5, 7, 11]
    assert played[:4] != played[4:8] or played[4:8] != played[8:]  # reshuffled between passes
    assert [trainer(seed=1)._tasks_for(s) for s in (1, 2, 3, 4)] == steps  # a resume's order
    assert [trainer(seed=2)._tasks_for(s) for s in (1, 2, 3, 4)] != steps


def test_without_shuffling_the_tasks_come_in_their_listed_order_every_pass() -> None:
    curriculum = trainer(shuffle_dataset=False)
    assert [curriculum._tasks_for(s) for s in (1, 2, 3)] == [[7, 3, 5], [11, 7, 3], [5, 11, 7]]

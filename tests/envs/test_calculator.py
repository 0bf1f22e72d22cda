"""The calculator env's generated tasks."""

from __future__ import annotations

import pytest

from agentgym import ConfigError
from agentgym.envs.calculator import MAX_TASKS, calculate, make_tasks


def test_task_answers_are_what_the_calculate_tool_returns() -> None:
    tasks = make_tasks(500, seed=7)
    assert {t["expression"].split()[1] for t in tasks} == {"+", "-", "*"}
    assert [t["answer"] for t in tasks] == [calculate(t["expression"]) for t in tasks]
    assert make_tasks(500, seed=7) == tasks and make_tasks(500, seed=8) != tasks


def test_tasks_are_distinct_so_a_held_out_range_is_never_trained_on() -> None:
    prompts = [t["prompt"] for t in make_tasks(2200, seed=1234)]  # the quickstart's tasks
    assert len(set(prompts)) == 2200
    assert not set(prompts[:100]) & set(prompts[200:])  # its held-out and training ranges
    assert len({t["expression"] for t in make_tasks(MAX_TASKS, seed=0)}) == MAX_TASKS
    with pytest.raises(ConfigError, match=f"num_tasks <= {MAX_TASKS}"):
        make_tasks(MAX_TASKS + 1, seed=0)

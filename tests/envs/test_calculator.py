"""The calculator env's generated tasks."""

from __future__ import annotations

from agentgym.envs.calculator import calculate, make_tasks


def test_task_answers_are_what_the_calculate_tool_returns() -> None:
    tasks = make_tasks(500, seed=7)
    assert {t["expression"].split()[1] for t in tasks} == {"+", "-", "*"}
    assert [t["answer"] for t in tasks] == [calculate(t["expression"]) for t in tasks]
    assert make_tasks(500, seed=7) == tasks and make_tasks(500, seed=8) != tasks

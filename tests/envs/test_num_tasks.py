"""Every built-in env that generates or cuts its task list refuses a ``num_tasks`` that is no
count, naming the option: ``--env-arg num_tasks=-5`` made the calculator an env of no tasks."""

from __future__ import annotations

from typing import Any

import pytest

import agentgym
from agentgym import ConfigError
from agentgym._tasks import check_num_tasks

NONE_MEANS_ALL = ["DocSearch", "Search", "PythonCode"]
GENERATED = ["Calculator", "MCP"]  # None is no count for these: they make the list


@pytest.mark.parametrize("env", NONE_MEANS_ALL + GENERATED)
@pytest.mark.parametrize("num_tasks", [0, -5])
def test_a_num_tasks_that_is_no_count_is_refused_naming_it(env: str, num_tasks: int) -> None:
    with pytest.raises(ConfigError, match=rf"^num_tasks must be an int >= 1.*got {num_tasks}$"):
        agentgym.make(f"agentgym/{env}-v0", num_tasks=num_tasks)


@pytest.mark.parametrize("num_tasks", [0, -5, 1.5, True, "3", None])
def test_the_check_takes_only_a_count(num_tasks: Any) -> None:
    """`make` refuses a value of the wrong type by the env's annotation; a direct caller of
    an env class or of `check_num_tasks` is refused here."""
    with pytest.raises(ConfigError, match=r"^num_tasks must be an int >= 1, got "):
        check_num_tasks(num_tasks, none_ok=False)
    check_num_tasks(None, none_ok=True)


def test_a_generated_list_past_what_agentgym_plays_is_refused_before_it_is_made() -> None:
    with pytest.raises(ConfigError, match="more than agentgym plays"):
        agentgym.make("agentgym/MCP-v0", num_tasks=10**12)


def test_the_smallest_count_still_makes_an_env() -> None:
    env = agentgym.make("agentgym/Calculator-v0", num_tasks=1)
    try:
        assert len(env.unwrapped.tasks) == 1
    finally:
        env.close()

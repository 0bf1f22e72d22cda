"""`ScriptedPolicy` refuses a script that is not a list of turns, instead of playing its parts."""

from __future__ import annotations

import asyncio

import pytest

import agentgym
from agentgym import ConfigError


def test_a_str_is_refused_not_played_character_by_character() -> None:
    with pytest.raises(ConfigError) as excinfo:
        agentgym.ScriptedPolicy("68.0")  # type: ignore[arg-type]
    message = str(excinfo.value)
    assert "turns must be a list of strings (one per assistant turn), got a str" in message
    assert "wrap it in a list, ['68.0']" in message and "\n" not in message


@pytest.mark.parametrize(
    ("turns", "fragment"),
    [
        (42, "or a function of the task returning one, got int 42"),
        (None, "got NoneType None"),
        (b"68.0", "got a bytes: wrap it in a list"),
        (["ok", 7], "but it holds int 7"),
    ],
)
def test_anything_but_a_list_of_strings_or_a_function_is_refused(
    turns: object, fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        agentgym.ScriptedPolicy(turns)  # type: ignore[arg-type]


def test_a_list_and_a_function_of_the_task_still_play() -> None:
    listed = agentgym.ScriptedPolicy(["first", "second"])
    per_task = agentgym.ScriptedPolicy(lambda task: [f"answer {task}"])
    one_turn_in = [{"role": "assistant", "content": "first"}]
    assert asyncio.run(listed.generate(one_turn_in, [])).text == "second"
    assert asyncio.run(per_task.generate([], [], task=3)).text == "answer 3"


def test_a_function_returning_a_str_fails_its_episode_with_the_fix() -> None:
    env = agentgym.ToolEnv(tasks=[{"prompt": "hi", "answer": "68.0"}])
    [trajectory] = agentgym.rollout(
        lambda: env, agentgym.ScriptedPolicy(lambda task: task["answer"]), tasks=[0]
    )
    assert trajectory.status == "error"
    assert "the turns function's result must be a list of strings" in (trajectory.error or "")

"""A teardown that fails after the episode was scored keeps the score (a fault probe's finding).

The exception used to replace the scored result: the episode became ``error`` with no reward,
and a trainer scored it as its group's worst for the env's own cleanup bug.
"""

from __future__ import annotations

from typing import Any

import pytest

import agentgym
from agentgym import ScriptedPolicy
from agentgym.envs.calculator import CalculatorEnv

ANSWER = "The answer is 90."  # calculator task 0: "What is 66 + 24?"


class CleanupFails(CalculatorEnv):
    """The calculator, whose teardown raises once an episode has been played."""

    async def teardown_episode(self) -> None:
        if self.state.turns:
            raise RuntimeError("the cleanup broke")


agentgym.register("tests/CleanupFails-v0", CleanupFails)


def test_a_teardown_failing_after_scoring_keeps_the_score_and_says_why() -> None:
    env = CleanupFails()
    env.reset(seed=0, options={"task": 0})
    _, reward, terminated, _, info = env.step(ANSWER)
    assert terminated and reward == info["final_reward"] > 0
    assert "RuntimeError: the cleanup broke" in info["teardown_error"]


def test_the_rollout_keeps_such_an_episode_ok_and_records_the_teardown() -> None:
    [episode] = agentgym.rollout("tests/CleanupFails-v0", ScriptedPolicy([ANSWER]), num_tasks=1)
    assert (episode.status, episode.error) == ("ok", None)
    assert episode.final_reward is not None and episode.final_reward > 0
    assert "the cleanup broke" in episode.info["teardown_error"]


def test_a_reward_failing_still_tears_down(monkeypatch: Any) -> None:
    torn: list[bool] = []

    class Counts(CalculatorEnv):
        async def teardown_episode(self) -> None:
            torn.append(True)

    env = Counts()
    env.reset(seed=0, options={"task": 0})

    async def broken(context: Any) -> Any:
        raise KeyboardInterrupt  # not a reward error: it propagates, after the teardown

    monkeypatch.setattr(env.rubric, "score", broken)
    with pytest.raises(KeyboardInterrupt):
        env.step(ANSWER)
    assert torn == [True]

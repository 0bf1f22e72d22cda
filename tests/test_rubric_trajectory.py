"""Reward functions that ask for the `trajectory` see the turns being scored, token ids included."""

from __future__ import annotations

import agentgym


class CountingPolicy:
    """Answers with fixed token ids, as a backend that reports them would."""

    async def generate(self, messages, tools, *, max_tokens=None, task=None):
        return agentgym.Completion(text="The answer is 42.", completion_ids=[7] * 30)


def length_penalty(trajectory) -> float:
    """A DAPO-style overlong penalty reads the sampled token count."""
    tokens = sum(len(turn.completion_ids or ()) for turn in trajectory.turns)
    return -tokens / 100


def make_env() -> agentgym.ToolEnv:
    rubric = agentgym.Rubric([length_penalty])
    return agentgym.ToolEnv(tasks=[{"prompt": "6 * 7?", "answer": "42"}], rubric=rubric)


def test_rubric_sees_the_final_turn_token_ids_through_the_rollout():
    [trajectory] = agentgym.rollout(make_env, CountingPolicy(), tasks=[0])
    assert trajectory.status == "ok"
    assert trajectory.final_reward == -0.3
    assert trajectory.scores == {"length_penalty": -0.3}


def test_stepping_by_hand_gives_no_trajectory_and_the_rubric_says_so():
    env = make_env()
    env.reset(seed=0)
    *_, info = env.step("The answer is 42.")
    assert info["scores"] == {"length_penalty": None}
    assert "AttributeError" in info["reward_errors"]["length_penalty"]

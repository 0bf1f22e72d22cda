"""`agentgym/MCP-v0`: the notes store world, whose reward reads the store, not the reply."""

from __future__ import annotations

import pytest

import agentgym
from agentgym.envs.mcp import make_tasks
from tests.conftest import hermes_call as call


@pytest.mark.slow  # five episodes, a notes server each
def test_reference_episodes_score_one_and_claims_alone_score_zero() -> None:
    env = agentgym.make("agentgym/MCP-v0", num_tasks=2)
    assert sorted(env.tools) == ["delete_note", "list_notes", "read_note", "write_note"]
    oracle = agentgym.rollout(env.spec.id, agentgym.ScriptedPolicy(env.reference_turns),
                              env_kwargs={"num_tasks": 2})  # fmt: skip
    assert [(t.status, t.final_reward) for t in oracle] == [("ok", 1.0), ("ok", 1.0)]
    task = env.tasks[0]
    liar = [f"I saved the note {task['note']!r} with the text: {task['text']}"]
    wrong = [call("write_note", name=task["note"], text=task["text"] + "!"), "Saved."]
    for turns in (liar, wrong):
        [t] = agentgym.rollout(env.spec.id, agentgym.ScriptedPolicy(turns), tasks=[0],
                               env_kwargs={"num_tasks": 2})  # fmt: skip
        assert t.status == "ok" and t.final_reward == 0.0


def test_tasks_are_deterministic_per_seed() -> None:
    assert make_tasks(5, seed=3) == make_tasks(5, seed=3) != make_tasks(5, seed=4)
    assert all(t["text"] in t["prompt"] and t["note"] in t["prompt"] for t in make_tasks(5, 3))

"""DocSearch: the BM25 corpus of standard-library docstrings and its two tools."""

from __future__ import annotations

import json

import pytest

import agentgym
from agentgym.envs.docsearch import corpus, index, names_the_function, read, search


def test_corpus_is_unique_and_sizeable():
    docs = corpus()
    assert len(docs) > 200
    assert len({d.name for d in docs}) == len(docs)
    assert len({d.summary for d in docs}) == len(docs)


def test_bm25_finds_the_described_function_first_almost_always():
    docs = corpus()
    top1 = sum(index().search(d.summary, 1)[0].name == d.name for d in docs) / len(docs)
    assert top1 >= 0.9


def test_search_and_read_tools():
    assert search("inverse hyperbolic cosine").splitlines()[0].startswith("math.acosh: ")
    assert "inverse hyperbolic cosine" in read("math.acosh")
    with pytest.raises(ValueError, match="no document named"):
        read("math.nope")


def test_reward_wants_the_exact_dotted_name():
    assert names_the_function("It is math.gcd.", "math.gcd") == 1.0
    assert names_the_function("It is math.gcdx", "math.gcd") == 0.0
    assert names_the_function("gcd", "math.gcd") == 0.0


def test_reference_episodes_score_one_and_search_is_multi_tool():
    env = agentgym.make("docsearch", num_tasks=20)
    assert sorted(s["function"]["name"] for s in env.tool_schemas) == ["read", "search"]
    trajectories = agentgym.rollout(
        "docsearch", agentgym.ScriptedPolicy(env.reference_turns), env_kwargs={"num_tasks": 20}
    )
    assert len(trajectories) == 20
    assert all(t.status == "ok" and t.final_reward == 1.0 for t in trajectories)


def test_read_of_an_unknown_name_goes_back_to_the_model():
    bad = {"name": "read", "arguments": {"name": "math.nope"}}
    turns = [f"<tool_call>{json.dumps(bad)}</tool_call>", "It is math.gcd."]
    [trajectory] = agentgym.rollout("docsearch", agentgym.ScriptedPolicy(turns), tasks=[0])
    assert trajectory.status == "ok"
    assert "no document named 'math.nope'" in trajectory.messages[3]["content"]
    assert trajectory.turns[0].tool_errors


def test_bad_num_tasks_is_a_config_error():
    with pytest.raises(agentgym.ConfigError, match="num_tasks"):
        agentgym.make("docsearch", num_tasks=0)

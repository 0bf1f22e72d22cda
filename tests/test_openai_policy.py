"""OpenAIPolicy against vLLM's real OpenAI-compatible server (CPU build, tiny local model).

What the server needs in the request (checked against vLLM 0.32 here): with tools,
``tool_choice="none"`` (the default "auto" is refused with HTTP 400 unless the server runs with
``--enable-auto-tool-choice --tool-call-parser``; "none" still renders the tools into the
prompt); ``return_token_ids`` for ``prompt_token_ids``/``token_ids``; ``logprobs`` for one
logprob per completion token.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest

import agentgym
from tests.conftest import CALCULATE_TOOL, agentgym_here, require

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]

TOOLS = [CALCULATE_TOOL]
CALL = agentgym.ToolCall("calculate", {"expression": "37 * 48"}, id="call_0")
HISTORY = [
    {"role": "system", "content": "Solve it."},
    {"role": "user", "content": "What is 37 * 48?"},
    {"role": "assistant", "content": "Let me compute.", "tool_calls": [CALL.to_openai()]},
    {"role": "tool", "tool_call_id": "call_0", "content": "1776"},
]


@pytest.fixture(scope="module")
def tokenizer(vllm_server):
    require("transformers")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vllm_server.model_dir)


def _check_tokens(completion: agentgym.Completion, tokenizer, max_tokens: int) -> None:
    ids, logprobs = completion.completion_ids, completion.logprobs
    assert ids and logprobs and len(ids) == len(logprobs) <= max_tokens
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in logprobs)
    assert completion.finish_reason in ("stop", "length")
    # vLLM's text is the decoded ids, minus the stop token and minus a trailing incomplete
    # UTF-8 sequence (a random byte-level model emits those; the detokenizer holds them back).
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    body = ids[:-1] if completion.finish_reason == "stop" and ids[-1] == eos else ids
    decoded = tokenizer.decode(body)
    assert decoded.startswith(completion.text)
    assert set(decoded[len(completion.text) :]) <= {"\ufffd"}


async def test_generate_returns_aligned_tokens_and_logprobs(vllm_server, tokenizer) -> None:
    policy = agentgym.OpenAIPolicy(
        vllm_server.base_url, vllm_server.model, sampling={"temperature": 1.0, "seed": 0}
    )
    try:
        for messages in (HISTORY[:2], HISTORY):
            completion = await policy.generate(messages, TOOLS, max_tokens=32)
            _check_tokens(completion, tokenizer, 32)
            # The server's prompt is exactly the local chat template (tools + hermes history).
            expected = tokenizer.apply_chat_template(
                messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            assert completion.prompt_ids == expected
            assert completion.message is None  # the server did not parse tool calls
    finally:
        await policy.aclose()


async def test_same_seed_same_completion(vllm_server, tokenizer) -> None:
    policy = agentgym.OpenAIPolicy(
        vllm_server.base_url, vllm_server.model, sampling={"temperature": 1.0, "seed": 7}
    )
    try:
        first = await policy.generate(HISTORY[:2], TOOLS, max_tokens=16)
        second = await policy.generate(HISTORY[:2], TOOLS, max_tokens=16)
    finally:
        await policy.aclose()
    assert first.completion_ids == second.completion_ids
    assert first.logprobs == pytest.approx(second.logprobs, abs=1e-4)


def test_rollout_on_calculator(vllm_server) -> None:
    policy = agentgym.OpenAIPolicy(
        vllm_server.base_url, vllm_server.model, sampling={"temperature": 1.0}
    )
    trajectories = agentgym.rollout(
        "agentgym/Calculator-v0",
        policy=policy,
        num_tasks=2,
        group_size=2,
        max_tokens_per_turn=48,
    )
    # A random model will not call tools correctly: check structure, not reward.
    assert [(t.task_index, t.group_index) for t in trajectories] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for trajectory in trajectories:
        assert trajectory.status in ("ok", "truncated"), trajectory.error
        assert trajectory.turns
        for turn in trajectory.turns:
            assert turn.prompt_ids and turn.completion_ids
            assert len(turn.completion_ids) == len(turn.logprobs) <= 48
        assert trajectory.messages[-1]["role"] in ("assistant", "tool", "user")
        ids, mask, _ = trajectory.flatten()  # one-turn episodes always flatten
        assert sum(mask) == sum(len(turn.completion_ids) for turn in trajectory.turns)
        assert len(ids) == len(mask)


def test_context_overflow_truncates_and_scores_instead_of_infra_error(vllm_server) -> None:
    policy = agentgym.OpenAIPolicy(vllm_server.base_url, vllm_server.model)
    huge_prompt = "Think about this. " * 400  # ~7,200 byte-level tokens > the server's 4,096
    [trajectory] = agentgym.rollout(
        "calculator", policy, tasks=[0], env_kwargs={"system_prompt": huge_prompt}
    )
    assert trajectory.status == "truncated", trajectory.error
    assert trajectory.turns == [] and trajectory.final_reward == 0.0
    assert "maximum context length" in trajectory.info["truncated_by"]


def test_a_server_started_without_the_adapter_api_is_told_apart(vllm_server) -> None:
    """The trainer's start check on real vLLM (no VLLM_ALLOW_RUNTIME_LORA_UPDATING here);
    tests/engine/test_fleet.py asks the same of servers started with it."""
    from agentgym.engine import RemoteVLLMPolicy, VLLMFleet
    from agentgym.engine._fleet import server_root

    fleet = VLLMFleet([vllm_server.base_url], vllm_server.model)
    assert not asyncio.run(fleet.serves_adapters(server_root(vllm_server.base_url)))
    policy = RemoteVLLMPolicy(vllm_server.model_dir, fleet, publishes_adapters=True)
    with pytest.raises(agentgym.ConfigError, match="start it with --enable-lora"):
        policy.start()


def test_cli_eval_against_the_server_records_token_ids(vllm_server, tmp_path) -> None:
    out = tmp_path / "run"
    proc = agentgym_here(
        "eval", "calculator", "--policy", "openai", "--base-url", vllm_server.base_url,
        "--model", vllm_server.model, "-n", "2", "--max-tokens", "32", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    trajectories = list(agentgym.read_jsonl(out / "trajectories.jsonl"))
    assert len(trajectories) == 2
    assert all(turn.completion_ids for t in trajectories for turn in t.turns)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens/completions_total"] > 0
    total = summary["tokens/completions_total"]
    assert summary["tokens/per_episode"] == total / summary["episodes"]


def test_cli_eval_serves_a_local_model_itself(tiny_model_dir, tmp_path) -> None:
    """In this process (`agentgym_here`): the engine it starts is what is tested, not the command's
    own process (tests/test_cli_vllm.py runs the console script)."""
    require("vllm")
    out = tmp_path / "run"
    proc = agentgym_here(
        "eval", "calculator", "--policy", "vllm", "--model-path", str(tiny_model_dir),
        "-n", "2", "--max-tokens", "16", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    trajectories = list(agentgym.read_jsonl(out / "trajectories.jsonl"))
    assert len(trajectories) == 2 and all(t.turns[0].completion_ids for t in trajectories)
    assert json.loads((out / "run.json").read_text())["model"] == str(tiny_model_dir)

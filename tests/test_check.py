"""`agentgym.check`: the pre-flight, including the chat-template prefix property."""

from __future__ import annotations

from pathlib import Path

import agentgym
from tests.conftest import require

# A template that rewrites history the way Qwen3 drops earlier <think> blocks: every
# assistant turn but the last loses its content once a later turn exists.
HISTORY_REWRITING_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and not loop.last %}<|im_start|>assistant\n[earlier]<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_check_passes_on_calculator_without_tokenizer():
    results = agentgym.check("calculator")
    names = [r.name for r in results]
    assert names[:2] == ["gymnasium check_env", "tool schemas"]
    assert any(n.startswith("parser round trip") for n in names)
    assert all(r.passed for r in results), results


def test_template_checks_pass_with_the_tiny_chatml_template(tiny_model_dir):
    # deltas rebuild the conversation, and the template speaks the parser's (hermes) format
    require("transformers")
    results = {r.name: r for r in agentgym.check("calculator", tokenizer=str(tiny_model_dir))}
    assert results["rollout mode"].detail.startswith("concat: 3 turns"), results["rollout mode"]
    assert results["chat template round trip"].passed, results["chat template round trip"]
    assert all(r.passed for r in results.values())


def test_rollout_mode_is_per_turn_when_history_is_rewritten(tiny_model_dir):
    transformers = require("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tokenizer.chat_template = HISTORY_REWRITING_TEMPLATE
    results = agentgym.check("calculator", tokenizer=tokenizer)
    result = next(r for r in results if r.name == "rollout mode")
    assert result.passed  # a per_turn model trains fine, one sample per turn
    assert result.detail.startswith("per_turn: the template rewrites assistant turn 1")
    assert "'[earlier]" in result.detail  # what the turn became, from a token boundary


def test_check_reports_a_broken_reference_solution():
    class BrokenReference(agentgym.ToolEnv):
        def __init__(self):
            tasks = [{"prompt": "hi", "answer": "1"}]
            super().__init__(tasks=tasks, rubric=agentgym.Rubric([score]))

        def reference_turns(self, task):
            return ["wrong"]

    def score(completion: str, answer: str) -> float:
        return float(completion == answer)

    agentgym.register("tests/BrokenReference-v0", BrokenReference)
    results = agentgym.check("tests/BrokenReference-v0")
    result = next(r for r in results if r.name == "reference episode")
    assert not result.passed
    assert "reward 0.0" in result.detail


def test_a_reward_function_that_never_returns_fails_its_row_instead_of_hanging_the_check():
    """An ``async def`` judge whose server went quiet hung `agentgym check` for good: the rows
    that play are bounded, the first past its time fails naming the cause, and the rows after
    it that would replay the same episode are skipped instead of hanging one by one."""
    import asyncio
    import time

    async def quiet_judge(completion: str) -> float:
        await asyncio.Event().wait()  # never set: the hang under test
        return 1.0

    class QuietJudge(agentgym.ToolEnv):
        def __init__(self):
            super().__init__(tasks=[{"prompt": "hi", "answer": "1"}],
                             rubric=agentgym.Rubric([quiet_judge]))  # fmt: skip

        def reference_turns(self, task):
            return ["1"]

    agentgym.register("tests/QuietJudge-v0", QuietJudge)
    started = time.monotonic()
    results = {r.name: r for r in agentgym.check("tests/QuietJudge-v0", episode_timeout=1)}
    assert time.monotonic() - started < 30
    gym = results["gymnasium check_env"]
    assert not gym.passed and gym.detail.startswith("did not finish in 1 s: a tool, reward")
    assert "Rubric(..., timeout=...)" in gym.detail
    for name in ("reference episode", "reward of wrong answers"):
        assert results[name].skipped, results[name]
        assert "gymnasium check_env did not finish" in results[name].detail
    assert results["tool schemas"].passed  # rows that play nothing still run


def test_template_round_trip_catches_a_parser_the_template_does_not_speak(tiny_model_dir):
    require("transformers")
    # the tiny template renders tool calls in hermes form; a llama3_json model's turns differ
    results = agentgym.check("calculator", tokenizer=str(tiny_model_dir), parser="llama3_json")
    result = next(r for r in results if r.name == "chat template round trip")
    assert not result.passed
    assert 'produced as \'{"name"' in result.detail and "writes '<tool_call>" in result.detail
    assert "the 'llama3_json' parser does not read" in result.detail
    assert "--env-arg parser=hermes" in result.detail  # the parser that reads it


def test_the_tiny_model_is_named_tiny_as_train_and_eval_name_it(tiny_model_dir):
    """``check --model tiny`` and ``VLLMPolicy("tiny")`` asked the hub for a model named tiny
    (offline: about 50 s of retries, then a failure)."""
    require("transformers")
    from agentgym.engine._model_dir import model_source

    rows = {r.name: r for r in agentgym.check("calculator", tokenizer="tiny")}
    assert rows["rollout mode"].detail.startswith("concat"), rows["rollout mode"]
    assert rows["chat template round trip"].verdict == "pass", rows["chat template round trip"]
    assert (Path(model_source("tiny")) / "config.json").is_file()
    assert model_source("tiny") == str(tiny_model_dir)  # the same model the tests build


def test_a_sandbox_env_says_first_that_its_image_is_missing_and_plays_nothing_without_it():
    """Every row that plays an episode failed with the same pool error, after a traceback."""
    require("docker")
    rows = {r.name: r for r in agentgym.check("pythoncode", image="agentgym-sandbox:no-such")}
    assert list(rows)[0] == "sandboxes" and not rows["sandboxes"].passed
    assert "agentgym sandbox build --tag agentgym-sandbox:no-such" in rows["sandboxes"].detail
    for played in ("gymnasium check_env", "reference episode"):
        assert rows[played].verdict == "skip", rows[played]
    assert [r.name for r in rows.values() if not r.passed] == ["sandboxes"]


def test_a_sandbox_env_with_its_image_passes_the_row_and_plays():
    """And it leaves no container running: the shared pool its episodes started (4 warm
    containers) outlived `check` until the process exited (a test worker's leak check)."""
    require("docker")
    from tests.sandboxes.conftest import own_containers

    before = {c.id for c in own_containers()}  # e.g. the sandbox tests' shared `pool`
    rows = {r.name: r for r in agentgym.check("pythoncode")}
    assert [c.short_id for c in own_containers() if c.id not in before] == []
    assert (
        rows["sandboxes"].verdict == "pass" and "agentgym-sandbox:py3" in rows["sandboxes"].detail
    )
    assert rows["reference episode"].verdict == "pass"


def test_check_leaves_the_shared_pools_the_process_already_had_warm():
    """It closes only the pools its rows started: a notebook's warm pool from an earlier
    rollout (one sandbox, not pythoncode's four) was torn down with them, and an episode
    of a rollout beside `check` ended ``infra_error``."""
    require("docker")
    from agentgym.sandboxes import SandboxToolEnv, _reap, close_shared_pools
    from tests.sandboxes.conftest import own_containers

    envs: list[SandboxToolEnv] = []

    def play() -> agentgym.Trajectory:
        def make() -> SandboxToolEnv:
            envs.append(SandboxToolEnv([], tasks=[{"prompt": "x"}], pool_size=1))
            return envs[-1]

        [trajectory] = agentgym.rollout(make, agentgym.ScriptedPolicy(["done"]), tasks=[0])
        return trajectory

    try:
        assert play().status == "ok"
        pool = envs[-1].pool
        assert pool is not None
        before = {c.id for c in own_containers()}
        warm = {c.id for c in own_containers() if c.labels.get(_reap.POOL) == pool.pool_id}
        rows = {r.name: r for r in agentgym.check("pythoncode")}
        assert rows["reference episode"].verdict == "pass", rows["reference episode"]
        assert warm and {c.id for c in own_containers()} == before  # its own pool went
        again = play()
        assert again.status == "ok", again.error
        assert envs[-1].pool is pool and not pool.closed
    finally:
        close_shared_pools()

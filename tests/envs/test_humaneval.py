"""The HumanEval code env on a real Docker daemon (and the explicit local backend)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import agentgym
from agentgym.envs import humaneval as humaneval_env
from agentgym.envs.humaneval import extract_code, load_problems
from agentgym.sandboxes import _local as local
from agentgym.sandboxes import close_shared_pools
from tests.sandboxes.conftest import (
    BLOCKING_CELL,
    MAKE_FIFO,
    alive,
    require_docker,
    wait_until_code_runs,
)


@pytest.fixture(autouse=True, scope="module")
def _close_pools():
    yield
    close_shared_pools()


def reference(env_id: str = "humaneval", **kwargs):
    env = agentgym.make(env_id, **kwargs)
    return agentgym.ScriptedPolicy(env.reference_turns)


def test_ships_all_164_problems():
    problems = load_problems()
    assert len(problems) == 164
    assert problems[0]["task_id"] == "HumanEval/0"


def test_extract_code_takes_the_last_fenced_block():
    reply = "first:\n```python\nx = 1\n```\nfinal:\n```python\ndef f():\n    return 2\n```"
    assert extract_code(reply) == "def f():\n    return 2\n"
    assert extract_code("def g(): pass") == "def g(): pass"
    assert extract_code("```\ndef h(): pass\n```") == "def h(): pass\n"  # untagged, alone


def test_a_bare_block_of_example_output_after_the_code_is_not_graded():
    reply = "```python\ndef f():\n    return 2\n```\nIt prints:\n```\n2\n```"
    assert extract_code(reply) == "def f():\n    return 2\n"


@pytest.mark.docker
def test_reference_solutions_score_one_in_docker():
    require_docker()
    trajectories = agentgym.rollout("humaneval", reference(), num_tasks=6, group_size=2)
    assert [t.status for t in trajectories] == ["ok"] * 12, [t.error for t in trajectories]
    assert all(t.final_reward == 1.0 for t in trajectories)
    first_tool_reply = trajectories[0].messages[3]
    assert first_tool_reply["role"] == "tool" and "status: ok" in first_tool_reply["content"]


@pytest.mark.docker
def test_wrong_answer_scores_zero_and_session_persists_across_turns():
    require_docker()
    turns = [
        '<tool_call>{"name": "run_python", "arguments": {"code": "secret = 41"}}</tool_call>',
        '<tool_call>{"name": "run_python", "arguments": {"code": "print(secret + 1)"}}</tool_call>',
        "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```",
    ]
    [trajectory] = agentgym.rollout("humaneval", agentgym.ScriptedPolicy(turns), tasks=[0])
    assert trajectory.status == "ok"
    assert "42" in trajectory.messages[5]["content"]  # the variable survived the turn
    assert trajectory.final_reward == 0.0
    assert trajectory.scores["has_code_block"] == 1.0


@pytest.mark.docker
def test_verification_sees_none_of_the_agents_files():
    require_docker()
    # the agent leaves a file behind; the answer is right only if verification cannot see it
    plant = {"name": "run_python", "arguments": {"code": "open('planted.txt', 'w').write('x')"}}
    answer = (
        "```python\nimport os\nassert not os.path.exists('planted.txt')\n\n"
        "def has_close_elements(numbers, threshold):\n"
        "    return any(abs(a - b) < threshold\n"
        "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```"
    )
    turns = [f"<tool_call>{json.dumps(plant)}</tool_call>", answer]
    [trajectory] = agentgym.rollout("humaneval", agentgym.ScriptedPolicy(turns), tasks=[0])
    assert "status: ok" in trajectory.messages[3]["content"]
    assert trajectory.status == "ok" and trajectory.final_reward == 1.0


@pytest.mark.docker
def test_a_missing_image_is_infra_error_not_a_zero_reward():
    require_docker()
    kwargs = {"image": "agentgym-no-such-image:0", "pool_size": 1}
    [trajectory] = agentgym.rollout("humaneval", reference(**kwargs), tasks=[0], env_kwargs=kwargs)
    assert trajectory.status == "infra_error"
    assert trajectory.final_reward is None
    assert "SandboxError" in trajectory.error


def test_local_backend_runs_and_scores(recwarn):
    local._warned.clear()  # it warns once per process; an earlier test may have used it
    trajectories = agentgym.rollout(
        "humaneval", reference(backend="local"), num_tasks=3, env_kwargs={"backend": "local"}
    )
    assert [t.final_reward for t in trajectories] == [1.0, 1.0, 1.0]
    assert any("NOT a security boundary" in str(w.message) for w in recwarn.list)


def call_run_python(code: str) -> str:
    call = {"name": "run_python", "arguments": {"code": code}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


class SignallingScript(agentgym.ScriptedPolicy):
    """Scripted turns; ``asked[k]`` is set when turn k is asked for (turn k-1 is over)."""

    def __init__(self, turns: list[str]) -> None:
        super().__init__(turns)
        self.asked = [asyncio.Event() for _ in turns]

    async def generate(self, messages, tools, **kwargs):
        self.asked[sum(m["role"] == "assistant" for m in messages)].set()
        return await super().generate(messages, tools, **kwargs)


@pytest.mark.docker
async def test_cancelling_an_episode_kills_its_code_before_the_sandbox_returns(monkeypatch):
    require_docker()
    # the cell's own timeout far above the bound below: a cancel that waited for the cell
    # would take it, however long the code took to start on a loaded machine
    monkeypatch.setattr(humaneval_env, "CELL_TIMEOUT_S", 60.0)
    envs = []

    def make():
        envs.append(agentgym.make("humaneval", pool_size=1))
        return envs[-1]

    policy = SignallingScript([call_run_python(MAKE_FIFO), call_run_python(BLOCKING_CELL), "x"])
    spec = agentgym.EpisodeSpec(task=0, task_index=0, group_index=0, seed=0)
    episode = asyncio.create_task(agentgym.run_episode(make, policy, spec))
    await policy.asked[1].wait()  # the FIFO exists; the blocking cell comes next
    [env] = envs
    lease = env.sandbox
    pid = await asyncio.to_thread(wait_until_code_runs, lease)
    pool, returned, checking = env.pool, [], []
    real_release = pool._release

    def release(sandbox, failed):  # when the sandbox goes back, is the code still running?
        began = time.monotonic()
        returned.append(alive(sandbox, pid))
        checking.append(time.monotonic() - began)  # the test's own docker exec, not the cancel's
        real_release(sandbox, failed)

    pool._release = release
    try:
        cancelled_at = time.monotonic()
        episode.cancel()
        with pytest.raises(asyncio.CancelledError):
            await episode
        took = time.monotonic() - cancelled_at - sum(checking)
    finally:
        del pool._release
    assert returned == [False], "the sandbox went back to the pool with the code running"
    # about 0.3 s idle; a cancel that waited for the cell would take most of its 60 s
    assert took < 20, f"cancelling took {took:.1f}s (the cell's own timeout is 60 s)"
    assert env.sandbox is None and lease.ended
    async with pool.alease(timeout=60) as sb:  # the pool serves a working sandbox again
        assert (await sb.arun("print(1)")).stdout == "1\n"

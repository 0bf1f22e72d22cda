"""A new user's journey through the HumanEval env: options, answer formats, both backends.

Each test pins a defect the journey found: options that passed the constructor and then
failed every episode, Python fences the grader did not read (a right answer scored 0), and
a tool description that told the model something false on the ``local`` backend.
"""

from __future__ import annotations

import json

import pytest

import agentgym
from agentgym import ConfigError
from agentgym.envs.humaneval import extract_code, has_code_block, load_problems
from agentgym.sandboxes import close_shared_pools
from tests.sandboxes.conftest import require_docker


@pytest.fixture(autouse=True, scope="module")
def _close_pools():
    yield
    close_shared_pools()


def run_call(code: str) -> str:
    """A hermes tool call of ``run_python``."""
    return (
        "<tool_call>"
        + json.dumps({"name": "run_python", "arguments": {"code": code}})
        + "</tool_call>"
    )


def solution(index: int = 0) -> str:
    """The canonical solution of problem ``index``, prompt included."""
    problem = load_problems()[index]
    return problem["prompt"] + problem["canonical_solution"]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), 1e9, 604795.0])
def test_a_per_test_timeout_no_verification_takes_is_refused_when_the_env_is_made(bad):
    # Before: make() accepted it and every episode's reward raised ConfigError ('error').
    with pytest.raises(ConfigError, match="per_test_timeout must be"):
        agentgym.make("humaneval", per_test_timeout=bad)


def test_a_valid_per_test_timeout_is_kept():
    assert agentgym.make("humaneval", per_test_timeout=2.5).per_test_timeout == 2.5


@pytest.mark.parametrize("tag", ["python3", "Python", "PY", "py3", "python title=solution.py"])
def test_python_fences_with_a_common_tag_are_graded(tag):
    # Before: ```python3 or ```Python was no code block; the whole reply was graded (score 0).
    reply = f"Here it is:\n```{tag}\n{solution()}```\nDone."
    assert extract_code(reply) == solution()
    assert has_code_block(reply) == 1.0


@pytest.mark.parametrize("tag", ["text", "bash", "pythonic", "json"])
def test_fences_of_other_languages_are_still_not_python(tag):
    reply = f"```python\n{solution()}```\nOutput:\n```{tag}\nTrue\n```"
    assert extract_code(reply) == solution()
    assert has_code_block(f"```{tag}\nx = 1\n```") == 0.0


@pytest.mark.docker
def test_a_right_answer_in_a_python3_fence_scores_one_in_docker():
    require_docker()
    turns = [f"```python3\n{solution()}```"]
    [trajectory] = agentgym.rollout("humaneval", agentgym.ScriptedPolicy(turns), tasks=[0])
    assert (trajectory.status, trajectory.final_reward) == ("ok", 1.0), trajectory.error


def tool_description(env: agentgym.Env) -> str:
    [run_python] = env.tools.values()
    return run_python.description


def test_the_local_backend_does_not_promise_a_python_session(recwarn):
    # Before: the model read "variables, imports and files persist" on both backends, but a
    # LocalSandbox call is a fresh process: only files persist.
    local = agentgym.make("humaneval", backend="local")
    assert "variables and imports do not" in tool_description(local)
    assert "variables, imports and files persist" in tool_description(agentgym.make("humaneval"))
    turns = [
        run_call("secret = 41\nopen('kept.txt', 'w').write('file kept')"),
        run_call("print(open('kept.txt').read())\nprint(secret + 1)"),
        f"```python\n{solution()}```",
    ]
    [trajectory] = agentgym.rollout(
        "humaneval", agentgym.ScriptedPolicy(turns), tasks=[0], env_kwargs={"backend": "local"}
    )
    second = trajectory.messages[5]["content"]
    assert "file kept" in second and "NameError" in second  # what the description now says
    assert (trajectory.status, trajectory.final_reward) == ("ok", 1.0), trajectory.error


def test_pythoncode_describes_the_backend_it_runs_on_too():
    # PythonCode offers HumanEval's tool: it told the model variables persist on local too.
    assert "variables and imports do not" in tool_description(
        agentgym.make("pythoncode", backend="local")
    )
    assert "variables, imports and files persist" in tool_description(agentgym.make("pythoncode"))

"""Nothing one episode does may raise the reward of a later episode, or of its own verdict.

Written as the policy being trained would try it: envs are reused across episodes
(`EnvPool`), sandboxes across leases (`SandboxPool`), and a GRPO group's siblings run in the
same process, so any state that outlives `reset` (or a lease) is a way to pass an answer on
or to make a wrong one pass. The sandbox-level tests are in
``tests/sandboxes/test_lease_isolation.py``.
"""

from __future__ import annotations

import pytest

from agentgym import ScriptedPolicy, rollout
from agentgym.envs.calculator import CalculatorEnv
from agentgym.envs.docsearch import DocSearchEnv
from agentgym.envs.pythoncode import PythonCodeEnv
from agentgym.sandboxes import close_shared_pools
from agentgym.sandboxes._verify import MARKER
from tests.conftest import hermes_call as call
from tests.conftest import require
from tests.sandboxes.conftest import require_docker
from tests.sandboxes.test_lease_isolation import KILLS_THE_SERVER, kill_the_server

ADD_TASK = {"prompt": "Write add(a, b) returning their sum.", "tests": ["assert add(1, 2) == 3"]}
WRONG = "```python\ndef add(a, b):\n    return 7\n```"

# A module named like one the code server imports at start. Imported by the server, it makes
# the server rewrite every verify report it passes on into one where every test passed.
FORGES_VERDICTS = f"""
import json, os, sys
_dumps = json.dumps
def _forge(obj, *args, **kwargs):
    if isinstance(obj, dict) and {MARKER!r} in str(obj.get("stdout", "")):
        passed = {{"name": "t", "passed": True, "status": "passed", "message": "", "duration": 0}}
        report = _dumps({{"tests": [passed], "runner": "assert"}})
        obj = {{**obj, "stdout": {MARKER!r} + report + "\\n"}}
    return _dumps(obj, *args, **kwargs)
json.dumps = _forge
del sys.modules[__name__]
saved = sys.path[:]
sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
try:
    import base64 as real
finally:
    sys.path[:] = saved
sys.modules[__name__] = real
"""
PLANT = f"with open('base64.py', 'w') as fh:\n    fh.write({FORGES_VERDICTS!r})\nprint('planted')"


@pytest.fixture(scope="module")
def code_env():
    """A PythonCode env on a pool of one sandbox: every episode gets the same container."""
    require_docker()
    env = PythonCodeEnv([ADD_TASK], pool_size=1, max_turns=4)
    yield env
    env.close()
    close_shared_pools()


def test_a_module_planted_for_the_code_server_cannot_pass_a_wrong_answer(code_env):
    # The policy writes the module, then kills the server from its own tool call; the host
    # restarts the server, and verification used to run through the planted module.
    turns = [call("run_python", code=PLANT + "\n" + KILLS_THE_SERVER), WRONG]
    [t] = rollout(lambda: code_env, ScriptedPolicy(turns), num_tasks=1)
    assert t.status == "ok", t.error
    assert "server died" in t.messages[3]["content"]  # the attack ran as intended
    assert t.final_reward == 0.0


def test_an_episode_cannot_pass_the_wrong_answer_of_a_later_episode(code_env):
    # The first episode plants the module; its session kernel kills the server once the
    # reply is out (here: the test, from outside, at that moment). The reset between the
    # episodes restarts the server; the next episode, which never calls a tool, answers wrong.
    code_env.reset(options={"task": 0})
    code_env.step(call("run_python", code=PLANT))
    container = code_env.sandbox.container_id
    kill_the_server(code_env.sandbox)
    *_, info = code_env.step(WRONG)
    assert info["final_reward"] == 0.0
    code_env.reset(options={"task": 0})
    assert code_env.sandbox.container_id == container, "a new container: nothing tested"
    *_, info = code_env.step(WRONG)
    assert info["final_reward"] == 0.0


# --- envs without a sandbox: nothing of an episode survives reset -----------------------------


def test_a_reused_calculator_or_docsearch_env_starts_each_episode_clean():
    # The state a reward reads (the conversation, the counters, the turns) is per episode; a
    # reused env must not carry the last episode's tool calls into the next one's score.
    for env, turns, metric in (
        (CalculatorEnv(num_tasks=1), [call("calculate", expression="2 + 2"), "4"],
         "used_calculator"),
        (DocSearchEnv(num_tasks=1), [call("search", query="greatest common divisor"), "x"],
         "searched"),
    ):
        env.reset(options={"task": 0})
        for turn in turns:
            env.step(turn)
        assert env.state.tool_call_count == 1
        messages, _ = env.reset(options={"task": 0})
        assert env.messages == messages and len(messages) == 2
        assert (env.state.tool_call_count, env.state.turns, env.state.done) == (0, [], False)
        *_, info = env.step("no tool this time")
        assert info["scores"][metric] == 0.0


def test_a_note_saved_in_one_mcp_episode_does_not_score_the_next_on_the_same_env():
    # The notes store's reward reads the store: a store kept across episodes of a reused env
    # would pay the next episode (or a sibling on the same task) for the first one's note.
    require("mcp")
    from agentgym.envs.mcp import MCPEnv

    env = MCPEnv(num_tasks=1)
    try:
        task = env.tasks[0]
        env.reset(options={"task": 0})
        env.step(call("write_note", name=task["note"], text=task["text"]))
        *_, info = env.step("Saved.")
        assert info["final_reward"] == 1.0
        env.reset(options={"task": 0})
        *_, info = env.step(f"I saved the note {task['note']!r}.")
        assert info["final_reward"] == 0.0
    finally:
        env.close()

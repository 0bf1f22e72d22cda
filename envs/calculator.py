"""Calculator: arithmetic word problems solved by calling a `calculate` tool.

The smallest real tool env: deterministic tasks (generated from a seed, no download), one
tool, a reward for the right final number. It is the embedded default of the quickstart and
the workhorse of the tests and benchmarks.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from agentgym import ConfigError, Rubric, ToolCall, ToolEnv, tool
from agentgym._tasks import check_num_tasks

_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
# A number as a reply writes it: a minus sign (ASCII or U+2212), digits with optional thousands
# commas (1,776) and an optional decimal part (1776.0). Exponents (1.776e3) are not numbers here.
_NUMBER = re.compile(r"[-\u2212]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.operand))
    raise ValueError("only numbers, + - * / // % and parentheses are allowed")


@tool(timeout=5.0)
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / // % and parentheses, e.g. "37 * (48 - 2)".
    """
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    value = _evaluate(ast.parse(expression, mode="eval"))
    return str(int(value) if float(value).is_integer() else round(value, 6))


_TASK_OPS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}


#: How many distinct problems there are: two numbers in 10..99 and one of three operators.
MAX_TASKS = 90 * 90 * len(_TASK_OPS)


def make_tasks(num_tasks: int, seed: int) -> list[dict[str, Any]]:
    """``num_tasks`` distinct two-number problems; the same seed always gives the same list.

    Distinct, so that a range of the list held out for evaluation never asks a question a
    training range asks too: drawn with repeats, 9 of the quickstart's 100 held-out questions
    were among its 2,000 training tasks. Answers are computed directly, not through
    `calculate` (whose parse made the quickstart's 2,200 tasks take 14 ms); tests check both
    agree.

    Raises:
        ConfigError: no tasks, or more than `MAX_TASKS`.
    """
    check_num_tasks(num_tasks, none_ok=False)
    if num_tasks > MAX_TASKS:
        raise ConfigError(
            f"calculator has {MAX_TASKS} distinct problems; ask for num_tasks <= {MAX_TASKS}, "
            f"got {num_tasks}"
        )
    rng = random.Random(seed)
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(tasks) < num_tasks:
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-*")
        expression = f"{a} {op} {b}"
        if expression in seen:
            continue
        seen.add(expression)
        answer = str(_TASK_OPS[op](a, b))
        tasks.append(
            {"prompt": f"What is {expression}?", "answer": answer, "expression": expression}
        )
    return tasks


def _value(number: str) -> Decimal:
    """A number as `_NUMBER` finds it, as a value: ``1,776`` and ``1776.0`` are 1776."""
    return Decimal(number.replace(",", "").replace("\u2212", "-"))


def correct_answer(completion: str, answer: str) -> float:
    """1 if the last number in the final reply has the answer's value; every other is ignored.

    The reply commits to its last number: "1776 or 1777" answers 1777. Values are `Decimal`,
    so a reply of any length or size is compared exactly and never raises.
    """
    numbers = _NUMBER.findall(completion or "")
    if not numbers:
        return 0.0
    if numbers[-1] == answer:  # the usual right reply: no arithmetic (the env loop's hot path)
        return 1.0
    return float(_value(numbers[-1]) == _value(answer))


def used_calculator(state: Any) -> float:
    """Metric only (weight 0): did the episode call a tool at all."""
    return float(state.tool_call_count > 0)


class CalculatorEnv(ToolEnv):
    """Answer ``What is a op b?``; reward 1 for the right number in the final reply.

    Args:
        num_tasks: size of the generated task list.
        seed: seed of the task generator (not of episodes).
        kwargs: any `ToolEnv` option (``parser``, ``max_turns``, ``max_episode_tokens`` ...).
    """

    def __init__(self, num_tasks: int = 100, seed: int = 1234, **kwargs: Any) -> None:
        kwargs.setdefault("max_turns", 4)
        kwargs.setdefault(
            "system_prompt",
            "You are a careful assistant. Use the calculate tool for arithmetic, "
            "then reply with the final number.",
        )
        super().__init__(
            [calculate],
            tasks=make_tasks(num_tasks, seed),
            rubric=Rubric([correct_answer, used_calculator], weights=[1.0, 0.0]),
            **kwargs,
        )

    def reference_turns(self, task: dict[str, Any]) -> list[str]:
        call = ToolCall("calculate", {"expression": task["expression"]})
        return [self.parser.render("", [call]), f"The answer is {task['answer']}."]

    def estimate_turns(self, task: dict[str, Any]) -> list[str]:
        """A weaker agent's habit: answer at once from a mental estimate, no tool.

        Each operand is rounded to the nearest ten, so the answer is right only when both
        already were (about 1 task in 100). Mixed into a warm start (the trainer's
        ``sft_scripts``), it teaches a model to skip the tool part of the time: the decision
        GRPO then learns from the reward.
        """
        a, op, b = task["expression"].split()
        rounded = f"{(int(a) + 5) // 10 * 10} {op} {(int(b) + 5) // 10 * 10}"
        return [f"The answer is {calculate(rounded)}."]

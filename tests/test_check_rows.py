"""`agentgym.check`'s rows on users' mistakes: each says what is wrong in one line, and a check
with nothing to check is skipped, not passed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import pytest

import agentgym
from agentgym import _registry as registry_module
from agentgym.sandboxes import Sandbox

TASKS = [{"prompt": "Which country is Lima in?", "answer": "Peru"}]


def lookup(city: str) -> str:
    """Return the country a city is in.

    Args:
        city: the city's English name.
    """
    return "Peru" if city == "Lima" else "unknown"


def correct(completion: str, answer: str) -> float:
    return float(answer in completion)


def boom(completion: str) -> float:
    raise ValueError("reward exploded")


@pytest.fixture
def row() -> Iterator[Callable[..., agentgym.CheckResult]]:
    """``row(name, tools, rubric=..., reference=...)``: that row of a check of such an env."""
    registered: list[str] = []

    def check_row(
        name: str,
        tools: list[Callable[..., Any]],
        rubric: agentgym.Rubric | None = None,
        reference: list[str] | None = None,
    ) -> agentgym.CheckResult:
        class Env(agentgym.ToolEnv):
            def __init__(self, **kwargs: Any) -> None:
                super().__init__(tools, tasks=TASKS, rubric=rubric, **kwargs)

            def reference_turns(self, task: dict[str, Any]) -> list[str] | None:
                return reference

        env_id = f"tests/CheckRows{len(registered)}-v0"
        registered.append(env_id)
        agentgym.register(env_id, Env)
        return next(r for r in agentgym.check(env_id) if r.name == name)

    yield check_row
    for env_id in registered:
        del gymnasium.registry[env_id]
        registry_module._OUR_IDS.discard(env_id)


# --- the reference episode -------------------------------------------------------------------


def test_an_env_without_a_reference_solution_is_skipped_not_passed(row) -> None:
    result = row("reference episode", [lookup], agentgym.Rubric([correct]))
    assert result.verdict == "skip" and result.skipped
    assert result.passed  # a skip never fails the run
    assert result.detail == "skipped: the env has no reference solution for task 0"


def test_a_played_reference_passes_as_a_pass(row) -> None:
    result = row("reference episode", [lookup], agentgym.Rubric([correct]), ["It is Peru."])
    assert result.verdict == "pass" and not result.skipped


def test_a_raising_reward_function_is_one_line_with_the_traceback_apart(row) -> None:
    result = row("reference episode", [lookup], agentgym.Rubric([correct, boom]), ["Peru"])
    assert result.verdict == "FAIL"
    assert result.detail == (
        "status error, reward 1.0: reward function 'boom' raised ValueError: reward exploded"
    )
    assert "Traceback (most recent call last)" in result.trace and "in boom" in result.trace


def test_an_env_without_a_rubric_says_why_its_reference_earns_nothing(row) -> None:
    result = row("reference episode", [lookup], None, ["Peru"])
    assert result.verdict == "FAIL"
    assert "reward 0.0: the env's own reference solution earns nothing" in result.detail
    assert "its rubric scores nothing (give the env rubric=Rubric([...]))" in result.detail


def test_a_rubric_scoring_the_reference_zero_shows_its_scores(row) -> None:
    result = row("reference episode", [lookup], agentgym.Rubric([correct]), ["Lima"])
    assert "earns nothing (scores {'correct': 0.0})" in result.detail


# --- the reward of a non-answer ---------------------------------------------------------------


def replied(completion: str) -> float:
    """Pays any final message: what a policy being trained learns to collect."""
    return float(bool(completion.strip()))


def test_a_reward_that_pays_a_non_answer_warns(row) -> None:
    result = row("reward of a non-answer", [lookup], agentgym.Rubric([replied]), ["It is Peru."])
    assert result.verdict == "warn" and result.passed  # the reward is the env author's call
    assert result.detail == (
        "'I cannot answer this.' at once earns 1, as much as the reference (1): the reward does "
        "not check the outcome, so training can raise it without solving a task (scores "
        "replied 1)"
    )


def test_a_reward_that_checks_the_answer_passes_and_no_reference_skips(row) -> None:
    result = row("reward of a non-answer", [lookup], agentgym.Rubric([correct]), ["It is Peru."])
    assert result.verdict == "pass"
    assert result.detail == "'I cannot answer this.' at once earns 0, the reference 1"
    unplayed = row("reward of a non-answer", [lookup], agentgym.Rubric([correct]))
    assert unplayed.verdict == "skip"
    unpaid = row("reward of a non-answer", [lookup], agentgym.Rubric([correct]), ["Lima"])
    assert unpaid.verdict == "skip" and unpaid.detail == "skipped: the reference earns 0"


# --- tool descriptions and parameters ------------------------------------------------------


def first(city: str) -> str:
    return city


def second(city: str) -> str:
    return city


def wrongdoc(city: str, n: int = 1) -> str:
    """Look a city up.

    Args:
        town: a city.
        n: how many.
    """
    return city


def add_todo(task: str, priority: int = 1) -> str:
    """Add a to-do item.

    Args:
        task: the to-do text.
        priority: 1-3.
    """
    return f"added {task!r}"


def remember(note: str, state: str) -> str:
    """Remember a note.

    Args:
        note: what to remember.
    """
    return note


async def run_code(code: str, task: dict[str, Any], sandbox: Sandbox | None) -> str:
    """Run code for the task.

    Args:
        code: the source.
        sandbox: the episode's sandbox (injected).
    """
    return code


def test_every_undocumented_tool_is_named(row) -> None:
    result = row("tool schemas", [first, second])
    assert result.verdict == "FAIL"
    assert result.detail == "tool(s) 'first', 'second' have no description: write a docstring"


def test_an_args_entry_the_function_does_not_take_fails_naming_both(row) -> None:
    result = row("tool parameters", [lookup, wrongdoc])
    assert result.verdict == "FAIL"
    assert (
        "tool 'wrongdoc': its docstring's Args: documents 'town', which it does not take "
        "(its parameters: 'city', 'n'); make the names match"
    ) in result.detail
    assert result.detail.endswith("parameters with no description: 'wrongdoc' (city)")


def test_an_injected_parameter_documented_as_the_models_fails_with_the_fix(row) -> None:
    result = row("tool parameters", [add_todo])
    assert result.verdict == "FAIL"
    assert result.detail == (
        "tool 'add_todo': parameter 'task' is documented in Args: ('the to-do text.') and "
        "annotated str, as if the model gave it, but the model never sees it: 'task' is "
        "filled with the env's task dict; rename it"
    )


def test_an_injected_parameter_typed_as_a_models_value_fails(row) -> None:
    result = row("tool parameters", [remember])
    assert result.verdict == "FAIL"
    assert "parameter 'state' is annotated str, as if the model gave it" in result.detail
    assert "'state' is filled with the episode's state; rename it" in result.detail


def test_injected_parameters_typed_and_documented_as_injected_pass(row) -> None:
    result = row("tool parameters", [lookup, run_code])
    assert result.verdict == "pass", result.detail
    assert result.detail == "2 tool(s) built from functions checked"

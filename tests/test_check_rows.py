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
        tasks: list[dict[str, Any]] = TASKS,
    ) -> agentgym.CheckResult:
        """``reference``: the turns of task 0's solution; other tasks answer their own."""

        class Env(agentgym.ToolEnv):
            def __init__(self, **kwargs: Any) -> None:
                super().__init__(tools, tasks=tasks, rubric=rubric, **kwargs)

            def reference_turns(self, task: dict[str, Any]) -> list[str] | None:
                if reference is None or task == tasks[0]:
                    return reference
                return [f"It is {task['answer']}."]

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


# --- the reward of wrong answers --------------------------------------------------------------

#: Three cities: the wrong answers for Lima are the other two tasks' solutions.
CITIES = [{"prompt": f"Which country is {city} in?", "answer": country}
          for city, country in (("Lima", "Peru"), ("Paris", "France"), ("Oslo", "Norway"))]


def replied(completion: str) -> float:
    """Pays any final message: what a policy being trained learns to collect."""
    return float(bool(completion.strip()))


def named_a_country(completion: str) -> float:
    """Pays a reply that names any country: the format, not the answer."""
    return float(any(c["answer"] in completion for c in CITIES))


def test_a_reward_that_pays_a_non_answer_warns(row) -> None:
    result = row("reward of wrong answers", [lookup], agentgym.Rubric([replied]), ["It is Peru."],
                 CITIES)  # fmt: skip
    assert result.verdict == "warn" and result.passed  # the reward is the env author's call
    assert result.detail == (
        "on task 0 'I cannot answer this.' 1, task 1's solution 1, task 2's solution 1, its "
        "reference 1: 'I cannot answer this.' and task 1's solution and task 2's solution paid "
        "as much, so the reward does not check the outcome and training can raise it without "
        "solving a task (scores of 'I cannot answer this.': replied 1)"
    )


def test_a_reward_that_pays_any_well_formed_answer_warns(row) -> None:
    result = row("reward of wrong answers", [lookup], agentgym.Rubric([named_a_country]),
                 ["It is Peru."], CITIES)  # fmt: skip
    assert result.verdict == "warn"
    assert result.detail.startswith("on task 0 'I cannot answer this.' 0, task 1's solution 1, "
                                    "task 2's solution 1, its reference 1: task 1's solution and "
                                    "task 2's solution paid as much")  # fmt: skip


def test_a_reward_that_checks_the_answer_passes_and_no_reference_skips(row) -> None:
    result = row("reward of wrong answers", [lookup], agentgym.Rubric([correct]), ["It is Peru."],
                 CITIES)  # fmt: skip
    assert result.verdict == "pass"
    assert result.detail == ("on task 0 'I cannot answer this.' 0, task 1's solution 0, task 2's "
                             "solution 0; its reference 1")  # fmt: skip
    one_task = row("reward of wrong answers", [lookup], agentgym.Rubric([correct]), ["Peru"])
    assert one_task.detail == "on task 0 'I cannot answer this.' 0; its reference 1"
    unplayed = row("reward of wrong answers", [lookup], agentgym.Rubric([correct]))
    assert unplayed.verdict == "skip"
    unpaid = row("reward of wrong answers", [lookup], agentgym.Rubric([correct]), ["Lima"])
    assert unpaid.verdict == "skip" and unpaid.detail == "skipped: the reference earns 0"


def test_tasks_sharing_task_0s_answer_are_not_played_as_its_wrong_answers(row) -> None:
    """Where answers repeat (yes/no, a few labels), another task's solution can be right."""
    shared = [{"prompt": f"Which country is {city} in?", "answer": country} for city, country
              in (("Lima", "Peru"), ("Cusco", "Peru"), ("Arequipa", "Peru"), ("Paris", "France"),
                  ("Oslo", "Norway"))]  # fmt: skip
    result = row("reward of wrong answers", [lookup], agentgym.Rubric([correct]), ["It is Peru."],
                 shared)  # fmt: skip
    assert result.verdict == "pass", result.detail  # tasks 1 and 2 would have been "paid"
    assert result.detail == ("on task 0 'I cannot answer this.' 0, task 3's solution 0, task 4's "
                             "solution 0; its reference 1")  # fmt: skip
    all_peru = [{**task, "answer": "Peru"} for task in shared]
    alone = row("reward of wrong answers", [lookup], agentgym.Rubric([correct]), ["It is Peru."],
                all_peru)  # fmt: skip
    assert alone.detail == "on task 0 'I cannot answer this.' 0; its reference 1"


def test_wrong_answers_are_not_played_when_the_reference_earns_nothing(row) -> None:
    graded: list[str] = []

    def grading(completion: str, answer: str) -> float:
        graded.append(completion)
        return correct(completion, answer)

    unpaid = row("reward of wrong answers", [lookup], agentgym.Rubric([grading]), ["Lima"],
                 CITIES)  # fmt: skip
    assert unpaid.detail == "skipped: the reference earns 0"
    assert graded and "I cannot answer this." not in graded  # a code env: a sandbox each
    assert "It is France." not in graded


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


def test_a_hand_written_schema_that_misnames_the_functions_parameters_fails(row) -> None:
    """It passed: every call the schema allowed then failed as the model's tool error."""

    def add(a: int, b: int) -> int:
        return a + b

    schema = {"type": "object", "properties": {"x": {"type": "integer"}, "a": {"type": "integer"}},
              "required": ["x", "a"]}  # fmt: skip
    misnamed = agentgym.Tool(fn=add, name="add", description="Add numbers.", parameters=schema)
    result = row("tool parameters", [lookup, misnamed])
    assert result.verdict == "FAIL"
    assert ("tool 'add': its schema offers 'x', which its function does not take (it takes "
            "'a', 'b'); every call the schema allows would fail") in result.detail  # fmt: skip
    assert "its function needs 'b', which its schema never asks the model for" in result.detail


def test_an_injected_parameter_documented_as_the_models_fails_with_the_fix(row) -> None:
    result = row("tool parameters", [add_todo])
    assert result.verdict == "FAIL"
    assert result.detail == (
        "tool 'add_todo': parameter 'task' is documented in Args: ('the to-do text.') and "
        "annotated str, as if the model gave it, but the model never sees it: 'task' is "
        "filled with the env's task dict; rename it"
    )


def look_up_task(task: dict, key: str) -> str:
    """Read a field of the task.

    Args:
        task: the current task.
        key: the field.
    """
    return str(task.get(key))


def test_an_injected_parameter_documented_only_names_both_fixes(row) -> None:
    result = row("tool parameters", [look_up_task])
    assert result.verdict == "FAIL"
    assert result.detail.endswith(
        "'task' is filled with the env's task dict; rename it, or say '(injected)' on its "
        "Args: line"
    ), result.detail


def test_an_injected_parameter_typed_as_a_models_value_fails(row) -> None:
    result = row("tool parameters", [remember])
    assert result.verdict == "FAIL"
    assert "parameter 'state' is annotated str, as if the model gave it" in result.detail
    assert "'state' is filled with the episode's state; rename it" in result.detail


def test_injected_parameters_typed_and_documented_as_injected_pass(row) -> None:
    result = row("tool parameters", [lookup, run_code])
    assert result.verdict == "pass", result.detail
    assert result.detail == "2 tool(s) built from functions checked"

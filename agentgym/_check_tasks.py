"""Do an env's tasks hold what its prompt and its reward functions read?

Why a check of its own: a task without ``prompt`` (under `ToolEnv`'s own `build_prompt`) fails
its episode at reset, and one without the ``answer`` a reward function asks for (no default)
gives it None, so its episodes end ``error``. Both played on: `agentgym check` passed them and
a training run trained for ``infra_error_patience`` steps before stopping. `agentgym check` and
the trainer's pre-flight share this one reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._tool_env import ToolEnv


def missing_task_fields(env: Any, indices: Sequence[int] | None = None) -> str | None:
    """What the env's tasks (those at ``indices``; all by default) lack, in one line; or None."""
    tasks = getattr(env, "tasks", None)
    if tasks is None:
        return None
    plain_prompt = isinstance(env, ToolEnv) and type(env).build_prompt is ToolEnv.build_prompt
    asking_for = getattr(getattr(env, "rubric", None), "asking_for", None)
    readers = asking_for("answer") if callable(asking_for) else []
    if not plain_prompt and not readers:
        return None
    indices = range(len(tasks)) if indices is None else indices
    no_prompt: list[int] = []
    no_answer: list[int] = []
    for index in indices:
        task = tasks[index]
        if not isinstance(task, dict):
            continue  # the env refuses it by name when it picks it
        if plain_prompt and "prompt" not in task:
            no_prompt.append(index)
        if readers and task.get("answer") is None:
            no_answer.append(index)
    if no_prompt:
        first = no_prompt[0]
        return (
            f"{len(no_prompt):,} of {len(indices):,} tasks have no 'prompt' (first: task "
            f"{first}, keys {sorted(tasks[first])}); give each task one (load_tasks(..., "
            "fields={'question': 'prompt'})), or override the env's build_prompt"
        )
    if no_answer:
        return (
            f"reward function(s) {readers} ask for 'answer', but {len(no_answer):,} of "
            f"{len(indices):,} tasks have none (first: task {no_answer[0]}); give every task "
            "an 'answer', or the parameter a default (answer=None) if it scores tasks without one"
        )
    return None

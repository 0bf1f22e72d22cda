"""A user's own tool env, from `agentgym check` to a training run, as the README walks it.

An env of the user's own module (``module:id``, imported from the working folder) is checked
and trained with the same refusals as a built-in one; each mistake found by playing that
journey was a dry run that said "every check passed" (or a run folder left behind) and is
now one line naming the fix, before anything loads:

- a tool without a docstring (`agentgym check` failed it; the dry run passed it);
- tasks without the ``answer`` a reward function asks for (every episode ``error``, the run
  stopped after ``infra_error_patience`` steps), or without a ``prompt``;
- a script that trains without an ``if __name__ == "__main__":`` guard: vLLM failed to start
  after the run folder was made, and the fixed script was refused ("pass --resume");
- the plan said "at steps 3" for one step;
- a malformed tool call (the env's error message, no tool run) then the right answer counted
  as a multi-turn success, and a step of only malformed calls logged a tool-error rate of 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym import ConfigError
from agentgym.trainers import GRPOConfig
from agentgym.trainers._metrics import episode_metrics, eval_metrics
from agentgym.trainers._plan import dry_run
from agentgym.trainers._run_dir import RunDir

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
CLI = str(Path(sys.executable).with_name("agentgym"))

#: The user's env module: a lookup tool, generated tasks, a rubric (README section 1).
CAPITALS = '''
import agentgym

COUNTRIES = {"Paris": "France", "Lima": "Peru", "Rome": "Italy", "Oslo": "Norway"}


@agentgym.tool
def lookup(city: str) -> str:
    """@DOC@"""
    return COUNTRIES.get(city, "unknown")


def correct(completion: str, answer: str) -> float:
    return float(answer in completion)


def make_tasks(n):
    cities = list(COUNTRIES)
    tasks = [
        {"prompt": f"Task {i}: which country is {cities[i % 4]} in?",
         "answer": COUNTRIES[cities[i % 4]]}
        for i in range(n)
    ]
    @MISTAKE@
    return tasks


class CapitalsEnv(agentgym.ToolEnv):
    def __init__(self, num_tasks=50, **kwargs):
        super().__init__([lookup], tasks=make_tasks(num_tasks),
                         rubric=agentgym.Rubric([@REWARD@]), **kwargs)


agentgym.register("@ENV_ID@", CapitalsEnv)
'''

DOC = "Return the country a city is in (city: its English name)."


def write_env(folder: Path, module: str, *, doc: str = DOC, mistake: str = "",
              reward: str = "correct") -> str:  # fmt: skip
    """Write the user's module into ``folder``; returns its ``module:id`` name."""
    env_id = f"journey/{module.title().replace('_', '')}-v0"
    source = (CAPITALS.replace("@DOC@", doc).replace("@MISTAKE@", mistake or "pass")
              .replace("@REWARD@", reward).replace("@ENV_ID@", env_id))  # fmt: skip
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    return f"{module}:{env_id}"


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's scratch folder as the working folder (``module:id`` is imported from it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the folder the import adds goes too
    return tmp_path


def knobs(env: str, **more: Any) -> dict[str, Any]:
    """A short run of the user's env, as their YAML would say it."""
    return {
        "model": "tiny", "env": env, "env_kwargs": {"num_tasks": 50}, "train_tasks": "10:50",
        "eval_tasks": "0:10", "num_generations": 2, "tasks_per_step": 2, "max_steps": 3,
        "max_turns": 2, "max_completion_length": 24, "max_model_len": 1024, "lora_r": 8,
        "device": "cpu", "report_to": ["none"], "output_dir": "runs/capitals", **more,
    }  # fmt: skip


def test_the_users_env_passes_the_dry_run_and_its_plan_says_step_once(scratch: Path) -> None:
    env = write_env(scratch, "capitals_ok")
    plan = dict(dry_run(GRPOConfig.from_dict(knobs(env, eval_steps=2, save_steps=3))))
    assert plan["tasks"] == "40 to train on, 10 held out for eval"
    assert plan["evaluation"].endswith("the first 10 at step 2")  # not "at steps 2"
    assert plan["checkpoints"].startswith("at step 3;")
    assert not (scratch / "runs").exists()


def test_a_tool_without_a_docstring_is_refused_by_the_dry_run(scratch: Path) -> None:
    env = write_env(scratch, "capitals_nodoc", doc="")
    with pytest.raises(ConfigError, match=r"tool\(s\) \['lookup'\] .* no description.*docstring"):
        dry_run(GRPOConfig.from_dict(knobs(env)))


def test_tasks_without_the_answer_a_reward_function_asks_for_are_refused(scratch: Path) -> None:
    env = write_env(scratch, "capitals_noanswer", mistake="for t in tasks[10:]: del t['answer']")
    with pytest.raises(ConfigError) as refused:
        dry_run(GRPOConfig.from_dict(knobs(env)))
    message = str(refused.value)
    assert "['correct'] ask for 'answer'" in message and "40 of 50 tasks" in message
    assert "first: task 10" in message and "answer=None" in message and "\n" not in message
    # a function that gives the parameter a default scores such tasks itself: not refused
    lenient = write_env(
        scratch, "capitals_lenient", mistake="for t in tasks[10:]: del t['answer']",
        reward="lambda completion, answer=None: float(bool(answer) and answer in completion)",
    )  # fmt: skip
    assert dict(dry_run(GRPOConfig.from_dict(knobs(lenient))))["run folder"].endswith("new run")


def test_agentgym_check_fails_tasks_without_the_answer_as_the_dry_run_does(scratch: Path) -> None:
    """`agentgym check` passed these tasks (exit 0, a one-time reward warning), no row."""
    module = write_env(scratch, "capitals_check", mistake="for t in tasks[10:]: del t['answer']")
    rows = {row.name: row for row in agentgym.check(module)}
    assert not rows["task fields"].passed
    assert "40 of 50 tasks have none (first: task 10)" in rows["task fields"].detail
    fine = {row.name: row for row in agentgym.check(write_env(scratch, "capitals_fine"))}
    assert fine["task fields"].passed


def test_tasks_without_a_prompt_are_refused(scratch: Path) -> None:
    env = write_env(scratch, "capitals_noprompt",
                    mistake="tasks = [{'question': t['prompt'], 'answer': t['answer']} "
                            "for t in tasks]")  # fmt: skip
    with pytest.raises(ConfigError, match=r"50 of 50 tasks have no 'prompt' \(first: task 10, keys "
                                          r"\['answer', 'question'\]\)"):  # fmt: skip
        dry_run(GRPOConfig.from_dict(knobs(env)))


def test_the_rubric_names_the_functions_that_need_a_field() -> None:
    def needs(completion: str, answer: str) -> float:
        return 0.0

    def optional(completion: str, answer: str | None = None) -> float:
        return 0.0

    def everything(**context: Any) -> float:
        return 0.0

    rubric = agentgym.Rubric([needs, optional, everything])
    assert rubric.asking_for("answer") == ["needs"]
    assert rubric.asking_for("completion") == ["needs", "optional"]
    assert rubric.asking_for("task") == []


def test_a_folder_holding_a_run_names_the_python_way_to_resume(tmp_path: Path) -> None:
    RunDir(tmp_path, {"model": "tiny"}).mark_finished()
    with pytest.raises(ConfigError, match=r"pass --resume .* GRPOTrainer\(config, resume=True\)"):
        RunDir(tmp_path, {"model": "tiny"})


def test_an_unguarded_training_script_is_refused_before_its_run_folder(scratch: Path) -> None:
    env = write_env(scratch, "capitals_script")
    config = knobs(env, output_dir=str(scratch / "runs" / "capitals"))
    script = scratch / "train_capitals.py"
    script.write_text(textwrap.dedent(f"""
        from agentgym.trainers import GRPOConfig, GRPOTrainer

        config = GRPOConfig.from_dict({config!r})
        GRPOTrainer(config).train()   # no guard: vLLM's engine process imports this again
    """))  # fmt: skip
    env_vars = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{scratch}"}
    ran = subprocess.run([PYTHON, str(script)], cwd=scratch, env=env_vars, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert ran.returncode != 0
    assert 'guard; vLLM\'s engine process imports the script again' in ran.stderr
    assert not (scratch / "runs" / "capitals").exists()  # the fixed script starts a new run


def test_the_cli_dry_run_of_a_users_module_refuses_in_one_line(scratch: Path) -> None:
    """From the scratch folder, as a user runs it: `check` and `train --dry-run` agree."""
    env = write_env(scratch, "capitals_cli", doc="")
    (scratch / "train.yaml").write_text(
        "\n".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}"
                  for k, v in knobs(env).items()).replace("'", '"') + "\n"  # fmt: skip
    )
    env_vars = {**os.environ, "PYTHONPATH": str(REPO)}
    check = subprocess.run([CLI, "check", env], cwd=scratch, env=env_vars, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert check.returncode == 1 and "no description" in check.stdout
    dry = subprocess.run([CLI, "train", "train.yaml", "--dry-run"], cwd=scratch, env=env_vars,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert dry.returncode == 2, dry.stdout + dry.stderr
    assert "Traceback" not in dry.stderr and "no description" in dry.stderr
    assert not (scratch / "runs").exists()


def played(env: str, *turns: str) -> agentgym.Trajectory:
    """The scored episode ``turns`` play on ``env``'s first task."""
    (episode,) = agentgym.rollout(env, agentgym.ScriptedPolicy(list(turns)), num_tasks=1)
    return episode


def test_a_malformed_call_then_the_right_answer_is_not_a_tool_calling_success(
    scratch: Path,
) -> None:
    env = write_env(scratch, "capitals_metrics")
    task = agentgym.make(env).tasks[0]  # {"prompt": "Task 0: ... Paris in?", "answer": "France"}
    answer, city = task["answer"], task["prompt"].split()[-2]
    call = f'<tool_call>{{"name": "lookup", "arguments": {{"city": "{city}"}}}}</tool_call>'
    called = played(env, call, answer)
    guessed = played(env, '<tool_call>{"name": "lookup", "argum', answer)  # cut-off call
    assert called.final_reward == guessed.final_reward == 1.0  # the rubric scores both
    assert eval_metrics([called])["eval/success"] == 1.0
    assert eval_metrics([guessed])["eval/success"] == 0.0  # no tool ran
    step = episode_metrics([guessed, guessed])
    assert step["rollout/tool_calls_per_episode"] == 0.0
    assert step["rollout/tool_error_rate"] == 1.0  # every attempt failed (it logged 0)
    assert episode_metrics([called])["rollout/tool_error_rate"] == 0.0

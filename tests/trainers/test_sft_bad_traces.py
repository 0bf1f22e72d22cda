"""``agentgym sft`` on traces it cannot train on: one line before the weights load, drops counted.

Conversations without an assistant turn crashed inside the model once the weights had loaded
(``cannot reshape tensor of 0 elements``), or counted as traces used while training nothing;
a ``reference_turns`` that raised ended in a traceback, and one that raised on some tasks
dropped their episodes without a word. Run for real on the tiny model and the calculator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import agentgym
from agentgym import ScriptedPolicy, write_jsonl
from tests.conftest import agentgym_here
from tests.trainers.test_sft_cli import FAST, agentgym_cli, one_error_line

HERE = "tests.trainers.test_sft_bad_traces"


def _lookup(city: str) -> str:
    """Return the country a city is in.

    Args:
        city: the city's English name.
    """
    return {"Paris": "France", "Lima": "Peru"}.get(city, "unknown")


def _correct(completion: str, answer: str) -> float:
    return float(answer in completion)


TASKS = [{"prompt": f"Which country is {c} in?", "answer": a}
         for c, a in [("Paris", "France"), ("Lima", "Peru")] * 5]  # fmt: skip


class _CityEnv(agentgym.ToolEnv):
    def __init__(self, **kwargs: object) -> None:
        super().__init__([agentgym.tool(_lookup)], tasks=TASKS,
                         rubric=agentgym.Rubric([_correct]), **kwargs)  # fmt: skip


class RaisesEnv(_CityEnv):
    """An oracle that raises on every task."""

    def reference_turns(self, task: dict) -> list[str]:
        raise RuntimeError("oracle broke")


class HalfEnv(_CityEnv):
    """An oracle that raises on the Lima tasks (half of them) and solves the others."""

    def reference_turns(self, task: dict) -> list[str]:
        if "Lima" in task["prompt"]:
            raise ValueError("no Lima")
        call = agentgym.ToolCall("_lookup", {"city": "Paris"})
        return [self.parser.render("", [call]), task["answer"]]


async def _hanging_lookup(city: str) -> str:
    """Return the country a city is in; never returns for Lima.

    Args:
        city: the city's English name.
    """
    if city == "Lima":
        await asyncio.Event().wait()
    return _lookup(city)


class HangsEnv(agentgym.ToolEnv):
    """An oracle whose tool never returns on the Lima tasks (half of them)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__([agentgym.tool(_hanging_lookup)], tasks=TASKS,
                         rubric=agentgym.Rubric([_correct]), **kwargs)  # fmt: skip

    def reference_turns(self, task: dict) -> list[str]:
        city = "Lima" if "Lima" in task["prompt"] else "Paris"
        call = agentgym.ToolCall("_hanging_lookup", {"city": city})
        return [self.parser.render("", [call]), task["answer"]]


agentgym.register("tests/SftRaises-v0", RaisesEnv)
agentgym.register("tests/SftHalf-v0", HalfEnv)
agentgym.register("tests/SftHangs-v0", HangsEnv)


@pytest.fixture(scope="module")
def episodes(tmp_path_factory: pytest.TempPathFactory) -> list[agentgym.Trajectory]:
    """Eight solved calculator episodes, as `agentgym eval` records them."""
    kwargs = {"num_tasks": 24}
    oracle = agentgym.make("calculator", **kwargs).reference_turns
    return agentgym.rollout("calculator", ScriptedPolicy(oracle), tasks=list(range(8)),
                            env_kwargs=kwargs)  # fmt: skip


def _without_assistant(episode: agentgym.Trajectory) -> agentgym.Trajectory:
    """The episode cut to its system and user messages: no token to train on."""
    return dataclasses.replace(episode, messages=episode.messages[:2], turns=[])


def test_traces_without_an_assistant_turn_are_refused_in_one_line(
    tiny_model_dir: Path, tmp_path: Path, episodes: list[agentgym.Trajectory]
) -> None:
    path = tmp_path / "noasst.jsonl"
    write_jsonl([_without_assistant(e) for e in episodes], path)
    out = tmp_path / "o"
    line = one_error_line(agentgym_cli("sft", tiny_model_dir, out, "--trajectories", path, *FAST))
    assert "none of the 8 SFT conversations" in line and "assistant turn" in line, line
    assert not out.exists()


def test_traces_without_an_assistant_turn_are_dropped_and_counted(
    tiny_model_dir: Path, tmp_path: Path, episodes: list[agentgym.Trajectory]
) -> None:
    path = tmp_path / "mixed.jsonl"
    write_jsonl([_without_assistant(e) if i % 2 else e for i, e in enumerate(episodes)], path)
    out = tmp_path / "o"
    done = agentgym_here("sft", tiny_model_dir, out, "--trajectories", path, *FAST)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "sft.json").read_text())
    assert summary["num_examples"] == 4
    assert summary["source"]["dropped"]["no_assistant_turn"] == 4
    assert "traces dropped: 4 without an assistant turn" in done.stdout, done.stdout


def sft_on_env(
    agentgym: Callable[..., subprocess.CompletedProcess[str]], model: Path, out: Path, env: str
) -> subprocess.CompletedProcess[str]:
    """``agentgym sft`` on ``env``, run by ``agentgym``: `agentgym_cli` (a new process imports
    this module for it: ``{HERE}:ID``), or `agentgym_here` where the process is not what is
    tested (the id this module registered at its import here). One step of one trace: what
    is checked is which episodes it kept and dropped, and what it said, not what it learnt."""
    return agentgym("sft", model, out, "--env", env, "--steps", "1", "--batch-size", "1")


def test_a_reference_turns_that_raises_is_one_line_naming_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o"
    proc = sft_on_env(agentgym_cli, tiny_model_dir, out, f"{HERE}:tests/SftRaises-v0")
    line = one_error_line(proc)
    assert "reference_turns raised RuntimeError: oracle broke" in line, line
    assert not out.exists()


def test_episodes_whose_reference_turns_raised_are_counted_as_dropped(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o"
    done = sft_on_env(agentgym_here, tiny_model_dir, out, "tests/SftHalf-v0")
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "sft.json").read_text())
    assert summary["num_examples"] == 5
    assert summary["source"]["dropped"] == {"status": 5, "reward": 0, "late": 0}
    assert "traces dropped: 5 not ok" in done.stdout, done.stdout


class WrongEnv(_CityEnv):
    """An oracle whose answer is always wrong: no episode succeeds."""

    def reference_turns(self, task: dict) -> list[str]:
        return ["I don't know"]


agentgym.register("tests/SftWrong-v0", WrongEnv)


@pytest.mark.parametrize(
    ("changes", "said"),
    [({"env": "tests/SftWrong-v0", "env_kwargs": {}, "train_tasks": "0:6", "eval_tasks": "6:8"},
      "no oracle episode of 'tests/SftWrong-v0' succeeded"),
     ({"max_model_len": 760}, "over the max_model_len (760)")],
)  # fmt: skip
def test_a_train_runs_warm_start_traces_are_refused_before_any_engine(
    tmp_path: Path, changes: dict, said: str
) -> None:
    """They failed only after vLLM had started and the base model was evaluated, and the
    dry run said "every check passed"."""
    from agentgym.trainers._config import GRPOConfig
    from agentgym.trainers._grpo import GRPOTrainer
    from agentgym.trainers._plan import dry_run
    from tests.conftest import TINY_RUN

    config = GRPOConfig(**{**TINY_RUN, "sft_steps": 4, "sft_num_traces": 4,
                           "output_dir": str(tmp_path / "run"), **changes})  # fmt: skip
    with pytest.raises(agentgym.ConfigError, match=re.escape(said)):
        dry_run(config)
    with pytest.raises(agentgym.ConfigError, match=re.escape(said)):
        GRPOTrainer(config)
    assert not (tmp_path / "run").exists()


def test_a_scripted_episode_that_hangs_is_cut_and_dropped_as_late(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A tool that never returned hung the warm start before step 1, with no word of why."""
    from trainers import _sft

    monkeypatch.setattr(_sft, "PLAY_SECONDS", 0.5)  # `agentgym check`'s bound: 300 s
    played = _sft.played_script("tests/SftHangs-v0")
    assert len(played.conversations) == 5  # the Paris tasks
    assert played.dropped == {"late": 5}
    assert "5 of 10 reference_turns episodes" in caplog.text and "still playing" in caplog.text

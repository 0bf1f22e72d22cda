"""A reward function that never returns, before step 1: the run and its dry run stop, naming it.

Why: the rollout mode is decided on the env's reference episode, played before step 1 with no
deadline; a judge call without a timeout hung `agentgym train` and `--dry-run` for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentgym
from agentgym import ConfigError
from agentgym.engine import HFPolicy
from agentgym.trainers import GRPOConfig, GRPOTrainer
from agentgym.trainers._plan import dry_run

#: Never set while a test runs: the judge's hang; set after it, to let its thread end.
_RELEASE = threading.Event()


def stuck_judge(completion: str) -> float:
    _RELEASE.wait()  # a judge's HTTP call without a timeout
    return 1.0


class StuckJudgeEnv(agentgym.ToolEnv):
    def __init__(self, **kwargs: object) -> None:
        tasks = [{"prompt": f"say {i}", "answer": str(i)} for i in range(4)]
        super().__init__(tasks=tasks, rubric=agentgym.Rubric([stuck_judge]), **kwargs)

    def reference_turns(self, task: dict[str, str]) -> list[str]:
        return [task["answer"]]


@pytest.fixture(autouse=True)
def _released() -> Iterator[None]:
    agentgym.register("tests/StuckJudge-v0", StuckJudgeEnv)
    _RELEASE.clear()
    yield
    _RELEASE.set()


def config(tmp_path: Path) -> GRPOConfig:
    return GRPOConfig(env="tests/StuckJudge-v0", output_dir=str(tmp_path / "run"), max_steps=2,
                      tasks_per_step=2, num_generations=2, report_to=["none"], device="cpu",
                      episode_deadline_s=2)  # fmt: skip


def assert_names_the_judge(error: ConfigError) -> None:
    message = str(error)
    assert "did not finish in 2 s: 'stuck_judge' (" in message, message
    assert "Rubric(..., timeout=...)" in message and "episode_deadline_s" in message
    assert "\n" not in message


def test_the_runs_mode_decision_stops_at_the_deadline_naming_the_reward_function(
    tmp_path: Path,
) -> None:
    trainer = GRPOTrainer(config(tmp_path))  # the real preflight
    policy = HFPolicy(trainer.model_dir)
    started = time.monotonic()
    with pytest.raises(ConfigError) as raised:
        trainer._decide_mode(policy)
    assert time.monotonic() - started < 30
    assert_names_the_judge(raised.value)


def test_the_dry_run_stops_at_the_deadline_naming_the_reward_function(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError) as raised:
        dry_run(config(tmp_path))
    assert time.monotonic() - started < 30
    assert_names_the_judge(raised.value)

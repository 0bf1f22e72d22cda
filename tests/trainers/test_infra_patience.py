"""`infra_error_patience`: a run whose infrastructure stays down stops with a checkpoint.

A broken episode never stops a run, but a step whose episodes all fail on infrastructure
trains on nothing; a run that kept going would spend every remaining step that way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym import InfraError
from agentgym.trainers import GRPOConfig
from envs.calculator import CalculatorEnv
from tests.conftest import TINY_RUN
from trainers._grpo import _infra_stop, _mostly_infra_errors


class FlakyCalculator(CalculatorEnv):
    """The calculator, whose tool service is down while ``down`` is set: for the train tasks'
    episodes, or for every episode with ``held_out_too``."""

    down = True
    held_out_too = False

    async def setup_episode(self, task: dict[str, Any]) -> None:
        held_out = task in self.tasks[:HELD_OUT]
        if FlakyCalculator.down and (FlakyCalculator.held_out_too or not held_out):
            raise InfraError("the calculator service refused the connection")
        await super().setup_episode(task)


HELD_OUT = 4  # TINY_RUN's eval tasks, 0:4


def episodes(*statuses: str) -> list[agentgym.Trajectory]:
    return [agentgym.Trajectory(env_id="e", status=s, error=f"{s}: boom") for s in statuses]


def test_a_step_is_broken_from_half_its_episodes_on() -> None:
    assert _mostly_infra_errors(episodes("infra_error", "ok"))
    assert not _mostly_infra_errors(episodes("infra_error", "ok", "error"))
    assert not _mostly_infra_errors([])
    assert _infra_stop(episodes("infra_error"), 2, 7, 3) is None
    assert _infra_stop(episodes("infra_error"), 9, 7, None) is None
    stop = _infra_stop(episodes("ok", "infra_error"), 3, 7, 3)
    assert isinstance(stop, InfraError) and "\n" not in str(stop)
    assert "stopped at step 7" in str(stop) and "infra_error: boom" in str(stop)


def test_the_knob_is_checked() -> None:
    with pytest.raises(agentgym.ConfigError, match="infra_error_patience"):
        GRPOConfig(infra_error_patience=0)


@pytest.mark.slow
def test_a_run_stops_after_broken_steps_with_a_checkpoint_and_resumes(tmp_path: Path) -> None:
    from agentgym.trainers import GRPOTrainer

    agentgym.register("tests/FlakyCalculator-v0", FlakyCalculator)
    run = tmp_path / "run"
    knobs = {
        **TINY_RUN, "env": "tests/FlakyCalculator-v0", "output_dir": str(run),
        "rollout_engine": "hf", "max_steps": 6, "eval_steps": None, "save_steps": None,
        "eval_num_tasks": 1, "infra_error_patience": 2, "report_to": ["tensorboard"],
    }  # fmt: skip
    FlakyCalculator.down, FlakyCalculator.held_out_too = True, False  # up for the step-0 eval
    with pytest.raises(InfraError, match="2 steps in a row.*refused the connection"):
        GRPOTrainer(GRPOConfig.from_dict(knobs)).train()
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and status["checkpoint_step"] == 2
    steps = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in steps if "data/tasks" in r] == [1, 2]
    assert all(r["rollout/infra_error_episodes"] == 4.0 for r in steps if "data/tasks" in r)
    FlakyCalculator.down = False  # fixed: the resumed run goes on from the checkpoint
    GRPOTrainer(GRPOConfig.from_dict({**knobs, "max_steps": 3}), resume=True).train()
    steps = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in steps if "data/tasks" in r] == [1, 2, 3]
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    # the health watch read the killed run's rows: 2 of the 3 steps lost every episode
    log = (run / "train.log").read_text()
    assert log.count("health [infra-errors] episodes are lost to infrastructure: 67% of") == 1
    assert "[infra-errors]" in (run / "summary.txt").read_text()
    # ... and told the user's tracker: a count per step, the finding in TensorBoard's Text tab
    reported = [r["health/reported"] for r in steps if "data/tasks" in r]
    # every episode of steps 1-2 was lost: reported from the first step (an all-failed run has
    # no noise to wait for), then again at step 3 as the recent steps' share
    assert reported[:2] == [1.0, 1.0] and reported[2] >= 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    texts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in
             events.Tensors("health/infra-errors/text_summary")]  # fmt: skip
    assert [step for step, _ in texts] == [1, 3]
    for _, text in texts:
        assert "lost to infrastructure" in text and "fix:" in text


@pytest.mark.slow
def test_a_run_whose_infrastructure_is_down_from_the_start_stops_at_its_first_eval(
    tmp_path: Path,
) -> None:
    """Its step-0 eval measured nothing, yet read "held-out success 0%" and the run went on."""
    from agentgym.trainers import GRPOTrainer

    agentgym.register("tests/FlakyCalculator-v0", FlakyCalculator)
    run = tmp_path / "run"
    knobs = {**TINY_RUN, "env": "tests/FlakyCalculator-v0", "output_dir": str(run),
             "rollout_engine": "hf", "max_steps": 3, "eval_steps": None}  # fmt: skip
    FlakyCalculator.down, FlakyCalculator.held_out_too = True, True
    try:
        with pytest.raises(
            InfraError,
            match=r"the held-out eval's 4 episodes all ended infra_error "
            r"\(one said: .*refused the connection\); the run stopped at step 0",
        ):
            GRPOTrainer(GRPOConfig.from_dict(knobs)).train()
    finally:
        FlakyCalculator.held_out_too = False
    assert json.loads((run / "status.json").read_text())["state"] == "failed"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert not [r for r in steps if "data/tasks" in r]  # no step trained on nothing
    assert [r["eval/infra_errors"] for r in steps if "eval/infra_errors" in r] == [4.0]
    assert not [r for r in steps if "eval/success" in r]  # not a 0% that was never measured

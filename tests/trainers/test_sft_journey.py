"""The SFT warm start as a new user plays it from the docs: bad inputs are one line, early.

Each test is a mistake found by playing the journey (README, docs/trainer.md "SFT warm
start"), which used to fail late or not at all:

- an env without an oracle (`ToolEnv.reference_turns` returns None) passed the dry run and
  failed once the warm start began, after the model loaded and the base eval ran;
- no trace to train on crashed inside the first batch (``max() arg is an empty sequence``);
- traces longer than the model's context trained silently past its positions;
- ``SFTConfig(target_accuracy=1.5)`` was accepted and could never be reached;
- ``chat_template_kwargs`` (e.g. Qwen3's ``enable_thinking``) could not reach the SFT render;
- a warm start shorter than 50 steps without a target left no line in the log.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym._errors import ConfigError
from envs.calculator import CalculatorEnv
from tests.conftest import require
from trainers._config import GRPOConfig

SMALL_TASKS = {"env_kwargs": {"num_tasks": 40}, "train_tasks": "10:40", "eval_tasks": "0:10"}
ENV_KWARGS = {"num_tasks": 8, "seed": 3}


class NoOracleCalculator(CalculatorEnv):
    """A user's env that never wrote `reference_turns`: the `ToolEnv` default (None)."""

    def reference_turns(self, task: dict[str, Any]) -> None:  # type: ignore[override]
        return None


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    agentgym.register("tests/NoOracleCalculator-v0", NoOracleCalculator)


def test_an_env_without_reference_turns_is_refused_before_the_model() -> None:
    from trainers._preflight import preflight

    config = GRPOConfig(model="/nonexistent", env="tests/NoOracleCalculator-v0", sft_steps=5,
                        **SMALL_TASKS)  # fmt: skip
    with pytest.raises(ConfigError, match=r"reference_turns returned None.*or set sft_steps 0"):
        preflight(config)


def test_the_same_env_without_a_warm_start_is_not_refused_for_it() -> None:
    from trainers._preflight import preflight

    config = GRPOConfig(model="/nonexistent", env="tests/NoOracleCalculator-v0", **SMALL_TASKS)
    with pytest.raises(ConfigError) as refused:  # the model folder, checked after the env
        preflight(config)
    assert "reference_turns" not in str(refused.value)


def test_a_target_accuracy_above_one_is_refused_by_sft_config() -> None:
    from trainers._sft import SFTConfig

    with pytest.raises(ConfigError, match=r"target_accuracy must be a share in \(0, 1\]"):
        SFTConfig(target_accuracy=1.5, eval_every=1)
    with pytest.raises(ConfigError, match="max_length must be >= 1"):
        SFTConfig(max_length=0)


def _no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make loading the model fail loudly: a refusal must come before it."""
    from transformers import AutoModelForCausalLM

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model loaded before the traces were checked")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.mark.parametrize(
    ("tasks", "knobs", "error"),
    [
        ([], {}, r"no trace to train on.*sft_steps 0"),  # an empty trace set
        ([0], {"max_length": 20}, r"over the SFTConfig.max_length \(20\); raise it to \d+ or more"),
    ],
    ids=["no_trace", "over_max_length"],
)
def test_traces_sft_cannot_train_on_are_one_line_before_the_model_loads(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    tasks: list[int], knobs: dict[str, Any], error: str,
) -> None:  # fmt: skip
    from trainers._sft import SFTConfig, sft_warm_start

    _no_model_load(monkeypatch)
    with pytest.raises(ConfigError, match=error):
        sft_warm_start(tiny_model_dir, "calculator", ENV_KWARGS, tmp_path / "sft",
                       SFTConfig(steps=2, **knobs), tasks=tasks)  # fmt: skip
    assert not (tmp_path / "sft").exists()


def test_traces_longer_than_the_models_context_are_refused(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainers._sft import SFTConfig, sft_warm_start

    model = tmp_path / "short"
    shutil.copytree(tiny_model_dir, model)
    spec = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**spec, "max_position_embeddings": 48}))
    _no_model_load(monkeypatch)
    with pytest.raises(ConfigError, match=r"tokens, over the model's max_position_embeddings=48"):
        sft_warm_start(model, "calculator", ENV_KWARGS, tmp_path / "sft", SFTConfig(steps=2),
                       tasks=[0, 1])  # fmt: skip


class _Recording:
    """A tokenizer that records the keyword arguments its chat template is rendered with."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.kwargs: list[dict[str, Any]] = []

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        self.kwargs.append(kwargs)
        return self._tokenizer.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def test_chat_template_kwargs_reach_every_sft_render(tiny_model_dir: Path) -> None:
    require("transformers")
    from transformers import AutoTokenizer

    from trainers._sft import _renderer, conversation_examples, oracle_conversations

    conversations, tools = oracle_conversations("calculator", ENV_KWARGS, tasks=[0])
    tokenizer = _Recording(AutoTokenizer.from_pretrained(tiny_model_dir))
    [plain], _ = conversation_examples(_renderer(tokenizer, None), conversations[0], tools)
    tokenizer.kwargs.clear()
    off = _renderer(tokenizer, {"enable_thinking": False})
    [example], mode = conversation_examples(off, conversations[0], tools)
    assert mode == "concat"
    assert tokenizer.kwargs and all(k["enable_thinking"] is False for k in tokenizer.kwargs)
    assert example.ids == plain.ids  # the tiny template ignores it: same tokens, same mask
    assert example.mask == plain.mask


def test_a_short_warm_start_says_when_it_is_done(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from trainers._sft import SFTConfig, sft_warm_start

    with caplog.at_level(logging.INFO):
        out = sft_warm_start(tiny_model_dir, "calculator", ENV_KWARGS, tmp_path / "sft",
                             SFTConfig(steps=2, batch_size=2, warmup_steps=0),
                             tasks=[0, 1, 2])  # fmt: skip
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sft done")]
    assert len(done) == 1 and "2 steps on 3 traces" in done[0] and str(out) in done[0]
    assert len(json.loads((out / "sft.json").read_text())["history"]) == 2


def test_the_run_warm_starts_on_the_env_template_and_context_its_rollouts_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_warm_start` played traces with the bare `env_kwargs` (no run `max_turns`), rendered
    them without `chat_template_kwargs` and never held them to `max_model_len`; a config had
    no way to warm-start with LoRA (`sft_method`)."""
    from agentgym.trainers import GRPOTrainer  # builds the env and the tiny model, no engine
    from agentgym.trainers import _grpo as grpo  # the module the trainer runs from

    seen: dict[str, Any] = {}

    def record(model_dir, env_id, env_kwargs, out, sft, **kwargs):  # type: ignore[no-untyped-def]
        seen.update(env_kwargs=env_kwargs, max_length=sft.max_length, method=sft.method,
                    lora=(sft.lora_rank, sft.lora_alpha), **kwargs)  # fmt: skip
        return out

    monkeypatch.setattr(grpo, "sft_warm_start", record)
    trainer = GRPOTrainer(grpo.GRPOConfig(
        env="calculator", train_tasks="10:40", eval_tasks="0:10", env_kwargs={"num_tasks": 40},
        sft_steps=5, max_turns=2, max_model_len=1024, report_to=["none"],
        chat_template_kwargs={"enable_thinking": False}, sft_method="lora", lora_r=8,
        lora_alpha=24,
    ))  # fmt: skip
    trainer._warm_start(type("Run", (), {"path": tmp_path})())  # type: ignore[arg-type]
    assert seen["env_kwargs"] == {"num_tasks": 40, "max_turns": 2}
    assert seen["chat_template_kwargs"] == {"enable_thinking": False}
    assert seen["max_length"] == 1024
    assert seen["method"] == "lora" and seen["lora"] == (8, 24)  # sft_method, the run's adapter

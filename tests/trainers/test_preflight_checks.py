"""preflight refuses, before any model loads or run folder exists, what used to fail later."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agentgym._errors import ConfigError
from tests.conftest import require
from trainers._config import GRPOConfig
from trainers._preflight import _check_context, preflight

SMALL_TASKS = {"env_kwargs": {"num_tasks": 40}, "train_tasks": "10:40", "eval_tasks": "0:10"}
#: A model path that does not exist: a refusal naming something else came before the model.
NO_MODEL = "/nonexistent"


def _refusal(config: GRPOConfig, fragment: str) -> str:
    with pytest.raises(ConfigError) as info:
        preflight(config)
    message = str(info.value)
    assert fragment in message, message
    assert "\n" not in message
    return message


# --- trackers ------------------------------------------------------------------------------


def test_a_tracker_that_is_not_installed_is_refused_before_the_model(monkeypatch) -> None:
    find_spec = importlib.util.find_spec  # hide wandb, installed here or not
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name)
    )
    config = GRPOConfig(model=NO_MODEL, report_to=["wandb"], **SMALL_TASKS)
    _refusal(config, "report_to includes 'wandb' but it is not installed; pip install wandb")


def test_a_tracker_that_cannot_be_imported_is_refused(monkeypatch, tmp_path: Path) -> None:
    broken = tmp_path / "wandb"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('protobuf too old')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    config = GRPOConfig(model=NO_MODEL, report_to=["wandb"], **SMALL_TASKS)
    message = _refusal(config, "report_to includes 'wandb' but it cannot be imported")
    assert "protobuf too old" in message


# --- the machine ---------------------------------------------------------------------------


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = require("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.usefixtures("no_cuda")
def test_device_cuda_without_cuda_names_the_fix() -> None:
    _refusal(GRPOConfig(model=NO_MODEL, device="cuda", **SMALL_TASKS), "use device: auto or cpu")


@pytest.mark.usefixtures("no_cuda")
@pytest.mark.parametrize(
    ("knobs", "fragment"),
    [
        ({"load_in_4bit": True}, "load_in_4bit=True with device='auto', the CPU here"),
        ({"dtype": "float16"}, "dtype='float16' with device='auto', the CPU here"),
    ],
)
def test_device_auto_on_a_cpu_machine_gets_the_cpu_rules(knobs: dict[str, Any], fragment: str):
    # the config alone cannot tell: device 'auto' is only known to be the CPU here
    config = GRPOConfig(model=NO_MODEL, device="auto", **knobs, **SMALL_TASKS)
    _refusal(config, fragment)


# --- the env -------------------------------------------------------------------------------


def test_an_env_with_no_tasks_names_env_kwargs() -> None:
    config = GRPOConfig(model=NO_MODEL, env_kwargs={"num_tasks": 0}, train_tasks="10:40",
                        eval_tasks="0:10")  # fmt: skip
    _refusal(config, "num_tasks must be an int >= 1, got 0")


def test_a_warm_start_with_no_trace_tasks_left_is_refused() -> None:
    # 140 tasks: 14 held out, 126 trained on, all of them kept back for validation
    config = GRPOConfig(model=NO_MODEL, env_kwargs={"num_tasks": 140}, sft_steps=5,
                        sft_target_accuracy=0.9)  # fmt: skip
    _refusal(config, "leaves no train task for SFT traces")


# --- the model folder ----------------------------------------------------------------------


@pytest.mark.parametrize("targets", [["nonexistent_proj"], "all_linear", ["q_proj", "qproj"]])
def test_lora_targets_the_model_lacks_list_the_valid_names(targets: Any) -> None:
    require("transformers")
    config = GRPOConfig(lora_target_modules=targets, rollout_engine="hf", **SMALL_TASKS)
    message = _refusal(config, f"lora_target_modules={targets!r}")
    assert "'q_proj'" in message and "'down_proj'" in message  # the valid names


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"], r".*\.(q|v)_proj"])
def test_lora_targets_the_model_has_pass(targets: Any) -> None:
    require("transformers")
    config = GRPOConfig(lora_target_modules=targets, rollout_engine="hf", **SMALL_TASKS)
    assert preflight(config).model_dir.is_dir()


def test_max_model_len_beyond_the_models_positions_is_refused() -> None:
    require("transformers")
    knobs = {"model": "tiny:quickstart", "rollout_engine": "hf", **SMALL_TASKS}
    message = _refusal(GRPOConfig(max_model_len=2048, **knobs), "max_model_len=2048")
    assert "max_position_embeddings=1024" in message
    assert preflight(GRPOConfig(max_model_len=1024, **knobs)).model_dir.is_dir()


def test_rope_scaling_extends_the_context_as_vllm_counts_it(tmp_path: Path) -> None:
    spec = {"max_position_embeddings": 1024, "rope_scaling": {"rope_type": "linear", "factor": 4}}
    (tmp_path / "config.json").write_text(json.dumps(spec))
    _check_context(tmp_path, GRPOConfig(max_model_len=4096))
    with pytest.raises(ConfigError, match="max_model_len=4097"):
        _check_context(tmp_path, GRPOConfig(max_model_len=4097))
    spec["rope_scaling"] = {"rope_type": "yarn", "factor": 4}  # already scaled: not again
    (tmp_path / "config.json").write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match="max_position_embeddings=1024"):
        _check_context(tmp_path, GRPOConfig(max_model_len=2048))


def test_4bit_on_cuda_without_bitsandbytes_is_refused(monkeypatch) -> None:
    torch = require("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    find_spec = importlib.util.find_spec  # hide bitsandbytes, installed here or not
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *a: None if name == "bitsandbytes" else find_spec(name),
    )  # fmt: skip
    config = GRPOConfig(model=NO_MODEL, device="cuda", load_in_4bit=True, **SMALL_TASKS)
    _refusal(config, "load_in_4bit=True but bitsandbytes is not installed")


def test_held_out_tasks_that_repeat_training_tasks_are_warned_about(caplog) -> None:
    """Index ranges can be disjoint while the tasks at them are equal (a dataset's duplicate
    rows): held-out success would then count questions the run trained on."""
    tasks = [{"question": f"Who wrote book {n % 10}?", "answer": "x"} for n in range(12)]
    config = GRPOConfig(model=NO_MODEL, env="search",
                        env_kwargs={"tasks": tasks, "split": "all"},
                        train_tasks="4:12", eval_tasks="0:4")  # fmt: skip
    with caplog.at_level("WARNING", logger="trainers._preflight"), pytest.raises(ConfigError):
        preflight(config)  # refused later, at the model that does not exist
    [warning] = [r.getMessage() for r in caplog.records if "held-out" in r.getMessage()]
    assert warning.startswith("2 of 4 held-out tasks repeat a training task (first: task 0)")


def test_distinct_held_out_tasks_are_not_warned_about(caplog) -> None:
    config = GRPOConfig(model=NO_MODEL, **SMALL_TASKS)
    with caplog.at_level("WARNING", logger="trainers._preflight"), pytest.raises(ConfigError):
        preflight(config)
    assert not [r for r in caplog.records if "held-out" in r.getMessage()]

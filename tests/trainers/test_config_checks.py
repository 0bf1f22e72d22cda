"""GRPOConfig refuses, when it is built, values that used to pass and fail (or mislead) later."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

import pytest

from agentgym._errors import ConfigError
from tests.conftest import require
from trainers._config import GRPOConfig

#: Every knob whose type admits a float (the non-finite rule must cover each one).
HINTS = typing.get_type_hints(GRPOConfig)
FLOAT_KNOBS = [
    f.name for f in dataclasses.fields(GRPOConfig)
    if HINTS[f.name] is float or (typing.get_origin(HINTS[f.name]) is types.UnionType
                                  and float in typing.get_args(HINTS[f.name]))
]  # fmt: skip


def _refused(fragment: str, **knobs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        GRPOConfig(**knobs)
    message = str(info.value)
    assert fragment in message, message
    assert "\n" not in message
    return message


def test_the_float_knobs_are_found() -> None:
    # the list the next test walks: a typo in the filter would make it test nothing
    assert {"temperature", "learning_rate", "beta", "lora_alpha", "epsilon_high",
            "episode_deadline_s", "sft_target_accuracy"} <= set(FLOAT_KNOBS)  # fmt: skip


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("name", FLOAT_KNOBS)
def test_non_finite_floats_are_refused_for_every_float_knob(name: str, value: float) -> None:
    # epsilon_high=nan trained to the end with loss nan; inf passed for temperature and others
    message = _refused(f"{name}={value!r} is not a finite number", **{name: value})
    assert "use a finite number" in message


def test_non_finite_floats_from_yaml_strings_are_refused() -> None:
    with pytest.raises(ConfigError, match="epsilon_high=nan is not a finite number"):
        GRPOConfig.from_dict({"epsilon_high": "nan"})
    with pytest.raises(ConfigError, match="sft_scripts="):
        GRPOConfig(sft_scripts={"reference": math.inf})


@pytest.mark.parametrize("seed", [10**23, 2**62, 2**31, -1])
def test_a_seed_out_of_range_names_the_range(seed: int) -> None:
    _refused(f"seed={seed} is out of range; use 0 <= seed < 2**31", seed=seed)


def test_every_seed_derived_from_the_largest_accepted_seed_fits_torch() -> None:
    torch = require("torch")
    seed = GRPOConfig(seed=2**31 - 1).seed
    # trainers/_grpo.py: seed * 100_003 + step, seed * 1_000_003 + step * episodes_per_step
    for derived in (seed * 100_003 + 10**6, seed * 1_000_003 + 10**6 * 10**4, seed * 7_919):
        torch.manual_seed(derived)
    assert GRPOConfig(seed=0).seed == 0


@pytest.mark.parametrize("output_dir", ["", "   "])
def test_an_empty_output_dir_is_refused(output_dir: str) -> None:
    _refused("name a run folder", output_dir=output_dir)


@pytest.mark.parametrize("tokens", [0, -5])
def test_max_episode_tokens_below_one_is_refused(tokens: int) -> None:
    _refused(f"max_episode_tokens={tokens} is out of range", max_episode_tokens=tokens)
    assert GRPOConfig(max_episode_tokens=1).max_episode_tokens == 1


def test_report_to_refuses_duplicates_and_reads_an_empty_list_as_none() -> None:
    _refused("names 'tensorboard' twice", report_to=["tensorboard", "tensorboard"])
    assert GRPOConfig(report_to=[]).report_to == ["none"]
    # `--set report_to=tensorboard,trackio` was one unknown tracker named with a comma
    assert GRPOConfig(report_to="tensorboard, trackio").report_to == ["tensorboard", "trackio"]
    assert GRPOConfig.from_dict({"report_to": "none"}).report_to == ["none"]
    assert "[]" in GRPOConfig.help("report_to")


@pytest.mark.parametrize(
    ("knobs", "name"),
    [
        ({"rollout_model_name": "qwen"}, "rollout_model_name='qwen'"),
        ({"adapter_storage": "/shared/adapters"}, "adapter_storage='/shared/adapters'"),
        ({"on_server_failure": "fail"}, "on_server_failure='fail'"),
    ],
)
def test_server_only_knobs_without_servers_are_refused(knobs: dict[str, Any], name: str) -> None:
    _refused(f"{name} applies only with rollout_servers", **knobs)
    with_servers = GRPOConfig(rollout_servers=["http://gpu-a:8000"], **knobs)
    assert with_servers.rollout_servers == ["http://gpu-a:8000"]


@pytest.mark.parametrize("url", ["not a url", "gpu-a:8000", "ftp://gpu-a:8000", "http://"])
def test_rollout_urls_must_be_http(url: str) -> None:
    _refused(f"{url!r} is not an http(s) URL", rollout_servers=[url])
    _refused(f"{url!r} is not an http(s) URL", rollout_servers=["http://a:8000"],
             rollout_router_url=url)  # fmt: skip
    ok = GRPOConfig(rollout_servers=["http://a:8000", "https://b/v1"],
                    rollout_router_url="http://r:30000")  # fmt: skip
    assert ok.rollout_router_url == "http://r:30000"


@pytest.mark.parametrize("share", [True, 0, -1.0])
def test_sft_script_shares_must_be_positive_numbers(share: Any) -> None:
    _refused("sft_scripts=", sft_scripts={"reference": share})


def test_a_warm_start_without_trace_tasks_is_refused() -> None:
    # validation takes the last 128 train tasks; with 128 of them nothing was left to imitate
    knobs = {"sft_steps": 10, "sft_target_accuracy": 0.9, "eval_tasks": "200:210"}
    _refused("leaves no train task for SFT traces", train_tasks="0:128", **knobs)
    assert GRPOConfig(train_tasks="0:129", **knobs).sft_steps == 10
    assert GRPOConfig(train_tasks="0:10", sft_steps=10, eval_tasks="200:210").sft_steps == 10



def test_max_staleness_takes_0_or_1_and_needs_the_importance_sampling_correction() -> None:
    _refused("max_staleness=2 is out of range; use 0 (on-policy) or 1", max_staleness=2)
    # without the correction nothing accounts for training on one version back
    _refused("set vllm_importance_sampling_correction: true, or max_staleness: 0",
             max_staleness=1, vllm_importance_sampling_correction=False)  # fmt: skip
    assert GRPOConfig(max_staleness=1).max_staleness == 1

"""GRPOConfig: defaults, every cross-field rule, YAML round trip, unknown keys."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentgym import ConfigError
from agentgym.trainers._config import VLLM_LORA_RANKS, GRPOConfig, parse_tasks


def test_defaults_are_valid_and_every_knob_is_documented() -> None:
    config = GRPOConfig()
    assert config.episodes_per_step == config.tasks_per_step * config.num_generations
    for f in dataclasses.fields(GRPOConfig):
        assert len(f.metadata["help"]) > 20, f.name
        assert f"{f.name}:" in (GRPOConfig.__doc__ or ""), f.name


@pytest.mark.parametrize(
    ("knobs", "fragment"),
    [
        ({"epsilon_high": 0.1}, "epsilon_high=0.1 is below epsilon=0.2"),
        ({"epsilon": 1.0}, "epsilon=1.0 must be in (0, 1)"),
        ({"num_generations": 1}, "num_generations=1"),
        ({"lora_r": 4}, "lora_r=4 cannot be served by vLLM"),
        ({"lora_target_modules": ["q_proj", "lm_head"]}, "['lm_head']"),
        ({"loss_type": "bnpo"}, "loss_type='bnpo' (str) is not a valid value, one of 'grpo', "
         "'dr_grpo', 'dapo', 'cispo', 'sapo', 'luspo', 'vespo'; TRL's 'bnpo' divides"),
        ({"scale_rewards": True}, "scale_rewards=True (bool) is not a valid value, one of "
         "'group', 'batch', 'none'; TRL's older spelling of 'group'"),
        ({"scale_rewards": "per_group"}, "'none'; Advantage scaling:"),  # the knob's help
        ({"learning_rate": "fast"}, "learning_rate='fast' (str)"),
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"beta": -0.1}, "beta=-0.1"),
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile=1.5"),
        ({"delta": 1.1}, "delta=1.1"),
        ({"off_policy_mask_threshold": -1.0}, "off_policy_mask_threshold=-1.0"),
        ({"entropy_coef": -0.1}, "entropy_coef=-0.1"),
        ({"vllm_gpu_memory_utilization": 0.0}, "vllm_gpu_memory_utilization=0.0"),
        ({"entropy_coef_min": 2.0}, "entropy_coef_min=2.0 is out of range"),
        ({"entropy_coef_delta": 0.0}, "entropy_coef_delta=0.0"),
        ({"entropy_target": -1.0}, "entropy_target=-1.0"),
        ({"use_adaptive_entropy": True, "entropy_coef": 2.0},
         "start adaptive entropy control inside [entropy_coef_min, entropy_coef_max]"),
        ({"loss_type": "cispo"}, "loss_type='cispo' caps the policy ratio at epsilon_high"),
        ({"sapo_temperature_neg": 0.0}, "sapo_temperature_neg=0.0"),
        ({"vespo_lambda_pos": 0.0}, "vespo_lambda_pos=0.0"),
        ({"loss_type": "vespo", "vllm_importance_sampling_mode": "sequence_mask"},
         "loss_type='vespo' folds per-token importance ratios"),
        ({"vllm_importance_sampling_mode": "sequence_clip"}, "vllm_importance_sampling_mode="),
        ({"vllm_importance_sampling_clip_min": 3.0}, "vllm_importance_sampling_clip_min=3.0"),
        ({"train_tasks": "100:1100", "eval_tasks": "50:150"}, "share 50 tasks (first: 100)"),
        ({"train_tasks": "5:5"}, "train_tasks='5:5'"),
        ({"eval_tasks": "0:100", "eval_num_tasks": 101}, "eval_num_tasks=101"),
        ({"train_tasks": "100:1100", "tasks_per_step": 2000}, "tasks_per_step=2000 exceeds"),
        ({"device": "cpu", "dtype": "float16"}, "dtype='float16' with device='cpu'"),
        ({"device": "cpu", "load_in_4bit": True}, "load_in_4bit=True"),
        ({"gradient_accumulation_steps": 33}, "gradient_accumulation_steps=33"),
        ({"report_to": ["none", "wandb"]}, "report_to="),
        ({"eval_steps": 0}, "eval_steps=0"),
        ({"save_total_limit": 0}, "save_total_limit=0 must be >= 1, or null: keep every"),
        ({"eval_steps": 0}, "eval_steps=0 must be >= 1, or null: no periodic eval"),
        ({"max_steps": 0}, "max_steps=0 must be >= 1"),
        ({"max_steps": -2}, "max_steps=-2 must be >= 1"),  # not "warmup_steps=0 is longer"
        ({"max_turns": 3, "env_kwargs": {"max_turns": 5}},
         "max_turns is given twice, max_turns: 3 and env_kwargs.max_turns: 5; keep one"),
        ({"max_episode_tokens": 64, "env_kwargs": {"max_episode_tokens": 32}},
         "max_episode_tokens is given twice"),
        ({"episode_deadline_s": 0}, "episode_deadline_s=0"),
        ({"vllm_importance_sampling_clip_max": 0.0}, "vllm_importance_sampling_clip_max=0.0"),
        ({"rollout_servers": ["http://a:8000"], "sft_steps": 10}, "start the servers on"),
        ({"rollout_router_url": "http://r:30000"}, "rollout_router_url needs rollout_servers"),
        ({"on_server_failure": "ignore"}, "on_server_failure='ignore'"),
        ({"rollout_engine": "hf", "rollout_servers": ["http://a:8000"]}, "servers are vLLM"),
        ({"rollout_engine": "sglang"}, "rollout_engine='sglang'"),
        ({"warmup_steps": 2}, "use 'constant_with_warmup' (or 'linear', 'cosine')"),
        ({"warmup_steps": 1.5, "lr_scheduler_type": "linear"}, "warmup_steps=1.5 is out of range"),
        ({"warmup_steps": 300, "lr_scheduler_type": "cosine"}, "longer than the run's max_steps"),
        ({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type='polynomial'"),
        ({"weight_decay": -0.1}, "weight_decay=-0.1 is out of range"),
        ({"entropy_coef_max": -1.0}, "entropy_coef_max=-1.0"),  # it blamed entropy_coef_min
    ],
)
def test_bad_knobs_raise_one_line_with_value_and_fix(knobs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        GRPOConfig(**knobs)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("schedule", "warmup"),
    [("constant", 0), ("constant_with_warmup", 3), ("linear", 0), ("linear", 4),
     ("cosine", 0.25), ("cosine", 0)],
)  # fmt: skip
def test_the_learning_rate_follows_transformers_schedule_of_the_same_name(
    schedule: str, warmup: float
) -> None:
    import torch
    from transformers import get_scheduler

    config = GRPOConfig(lr_scheduler_type=schedule, warmup_steps=warmup, max_steps=12,
                        learning_rate=2e-3)  # type: ignore[arg-type]  # fmt: skip
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=2e-3)
    warmup_steps = warmup if warmup >= 1 else int(-(-warmup * 12 // 1))
    reference = get_scheduler(schedule, optimizer, num_warmup_steps=warmup_steps,
                              num_training_steps=12)  # fmt: skip
    expected = []
    for _ in range(12):  # one optimiser step per GRPO step, as with num_iterations 1
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        reference.step()
    ours = [config.learning_rate_at(step) for step in range(1, 13)]
    assert ours == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert len(set(ours)) == (1 if schedule == "constant" else len(set(expected)))


def test_every_vllm_rank_is_accepted() -> None:
    assert [GRPOConfig(lora_r=r).lora_r for r in VLLM_LORA_RANKS] == list(VLLM_LORA_RANKS)


def test_sequence_level_with_token_sum_loss_warns_like_trl() -> None:
    with pytest.warns(UserWarning, match="GSPO"):
        GRPOConfig(importance_sampling_level="sequence", loss_type="dapo")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPOConfig(importance_sampling_level="sequence", loss_type="grpo")


@pytest.mark.parametrize(
    ("knobs", "message"),
    [({"loss_type": "luspo"}, "as published it uses importance_sampling_level='sequence'"),
     ({"loss_type": "vespo", "importance_sampling_level": "sequence"},
      "as published it uses importance_sampling_level='token'")],
)  # fmt: skip
def test_a_loss_at_the_ratio_level_its_paper_does_not_use_warns_like_trl(
    knobs: dict, message: str
) -> None:
    with pytest.warns(UserWarning, match=message) as caught:
        GRPOConfig(**knobs)
    assert caught[0].filename == __file__  # the line that built the config, not dataclass code


def test_truncated_sampling_warns_that_is_weights_are_biased() -> None:
    with pytest.warns(UserWarning, match="biased"):
        GRPOConfig(top_p=0.9)


def test_a_full_weight_learning_rate_warns_that_lora_barely_learns() -> None:
    with pytest.warns(UserWarning, match="LoRA needs about 10x") as caught:
        GRPOConfig(learning_rate=1e-6)  # TRL's default, for full weights
    assert caught[0].filename == __file__  # points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GRPOConfig(learning_rate=1e-5)


def test_unknown_key_suggests_the_close_knob() -> None:
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        GRPOConfig.from_dict({"learning_rat": 1e-5})


@pytest.mark.parametrize(
    ("key", "fix"),
    [("per_device_train_batch_size", "set tasks_per_step"),
     ("generation_batch_size", "set tasks_per_step"),  # not the closest spelling, sft_batch_size
     ("use_vllm", "set rollout_engine: vllm"), ("max_tool_calling_iterations", "set max_turns"),
     ("bf16", "set dtype: bfloat16"), ("num_train_epochs", "set max_steps")],
)  # fmt: skip
def test_a_trl_key_without_a_knob_here_names_what_to_set(key: str, fix: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown config key '{key}'; it is TRL's; here") as info:
        GRPOConfig.from_dict({key: 1})
    assert fix in str(info.value)


def test_the_trl_keys_table_names_only_trl_keys_and_our_knobs() -> None:
    """Each key is TRL's, not ours (else unreachable); each snake_case word of a fix is ours."""
    import re

    from tests.conftest import require
    from trainers._trl_keys import TRL_KEYS, TRL_VALUES

    trl = require("trl")
    ours = {f.name for f in dataclasses.fields(GRPOConfig)}
    trls = {f.name for config in (trl.GRPOConfig, trl.ModelConfig, trl.ScriptArguments)
            for f in dataclasses.fields(config)}  # fmt: skip
    assert not set(TRL_KEYS) & ours
    # keys of TRL configs before 1.16 / transformers 5, and a GRPOTrainer argument
    older = {"max_prompt_length", "warmup_ratio", "logging_dir", "reward_funcs"}
    assert set(TRL_KEYS) - older <= trls, sorted(set(TRL_KEYS) - older - trls)
    named = {word for fix in TRL_KEYS.values() for word in re.findall(r"\b[a-z]+_[a-z_]+\b", fix)}
    assert named and named <= ours, sorted(named - ours)
    assert {knob for knob, _ in TRL_VALUES} <= ours  # values TRL takes for knobs we share
    for (knob, value), fix in TRL_VALUES.items():
        with pytest.raises(ConfigError, match=re.escape(fix)):
            GRPOConfig.from_dict({knob: value})


def test_deprecated_trl_name_is_forwarded() -> None:
    with pytest.warns(FutureWarning, match="vllm_importance_sampling_clip_max"):
        config = GRPOConfig.from_dict({"vllm_importance_sampling_cap": 2.0})
    assert config.vllm_importance_sampling_clip_max == 2.0


def test_yaml_round_trip_and_yaml_1_1_float_strings(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    # PyYAML reads 1e-5 as the string '1e-5'; the config still gets a float
    path.write_text("learning_rate: 1e-5\nloss_type: grpo\nlora_r: 8\nreport_to: none\n")
    config = GRPOConfig.from_yaml(path, overrides={"seed": 7})
    assert (config.learning_rate, config.loss_type, config.lora_r) == (1e-5, "grpo", 8)
    assert (config.seed, config.report_to) == (7, ["none"])
    assert GRPOConfig.from_dict(config.to_dict()) == config


def test_yaml_that_is_not_a_mapping_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        GRPOConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="cannot read config"):
        GRPOConfig.from_yaml(tmp_path / "missing.yaml")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"model: tiny\nenv: caf\xe9\n")  # a UnicodeDecodeError traceback
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 20\); save it as UTF-8"):
        GRPOConfig.from_yaml(latin)


def test_broken_yaml_is_one_line_naming_the_file_and_place(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("model: tiny\nenv: [calculator\n")
    with pytest.raises(ConfigError) as caught:
        GRPOConfig.from_yaml(path)
    message = str(caught.value)
    assert "\n" not in message and "broken.yaml" in message and "not valid YAML at line" in message


def test_cli_set_with_broken_yaml_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("model: tiny\nenv: calculator\n")
    agentgym = Path(sys.executable).with_name("agentgym")
    proc = subprocess.run([str(agentgym), "train", str(path), "--set", "num_generations=[2"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr  # was a traceback
    assert "--set 'num_generations=[2' is not valid YAML" in lines[0], proc.stderr
    proc = subprocess.run([str(agentgym), "train", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "is a folder, not a YAML file" in proc.stderr, proc.stderr


def test_a_dotted_set_changes_one_entry_of_a_mapping_knob(tmp_path: Path) -> None:
    """``--set env_kwargs.parser=mistral`` was refused as an unknown key; the file's other
    env options stay, and a knob that is not a mapping says to set it whole."""
    path = tmp_path / "run.yaml"
    path.write_text("env_kwargs: {num_tasks: 40, tool_prompt: system}\n")
    config = GRPOConfig.from_yaml(path, overrides={
        "env_kwargs.parser": "mistral", "chat_template_kwargs.enable_thinking": False,
        "sft_scripts.reference": 0.5})  # fmt: skip
    assert config.env_kwargs == {"num_tasks": 40, "tool_prompt": "system", "parser": "mistral"}
    assert config.chat_template_kwargs == {"enable_thinking": False}  # from its default
    assert config.sft_scripts["reference"] == 0.5
    with pytest.raises(ConfigError, match=r"max_steps is int, not a mapping; set it whole"):
        GRPOConfig.from_yaml(path, overrides={"max_steps.x": 1})
    with pytest.raises(ConfigError, match=r"unknown config key 'env_kwarg.parser'"):
        GRPOConfig.from_yaml(path, overrides={"env_kwarg.parser": "mistral"})


def test_mutable_defaults_are_not_shared() -> None:
    first, second = GRPOConfig(), GRPOConfig()
    first.env_kwargs["num_tasks"] = 10
    assert second.env_kwargs == {}


def test_unset_task_ranges_split_the_envs_tasks() -> None:
    # the defaults fit any env: a tenth held out (at most 100), the rest trained on
    assert GRPOConfig().task_split(100) == (list(range(10, 100)), list(range(10)))
    assert GRPOConfig().task_split(2200) == (list(range(100, 2200)), list(range(100)))
    held_out_first = GRPOConfig(train_tasks="0:5").task_split(20)
    assert held_out_first == (list(range(5)), [5, 6])  # the first tasks not trained on
    assert GRPOConfig(eval_tasks=[3], tasks_per_step=2).task_split(4) == ([0, 1, 2], [3])
    with pytest.raises(ConfigError, match="reach task 99 but 'calculator' has 50 tasks"):
        GRPOConfig(eval_tasks="0:100").task_split(50)
    with pytest.raises(ConfigError, match="tasks_per_step=8 exceeds the 2 train_tasks"):
        GRPOConfig(tasks_per_step=8).task_split(3)  # known only once the env is
    with pytest.raises(ConfigError, match="eval_num_tasks=20 must be between 1 and the 10"):
        GRPOConfig(eval_num_tasks=20).task_split(100)
    # an env of one task: "lower tasks_per_step" below 1 was the advice
    with pytest.raises(ConfigError, match="the default split held out every one of the env's 1 "
                       "task.* set train_tasks and eval_tasks"):  # fmt: skip
        GRPOConfig().task_split(1)


def test_parse_tasks() -> None:
    assert parse_tasks("2:5") == [2, 3, 4]
    assert parse_tasks([7, 3]) == [7, 3]
    for bad in ("5", "a:b", "3:1", [1, 1], [-1]):
        with pytest.raises(ConfigError):
            parse_tasks(bad)


def test_the_knobs_the_docs_say_carry_over_from_trl_are_ours_and_trls() -> None:
    """docs/trainer.md lists the knobs a TRL config and ours share by name; keep it true."""
    import re

    from tests.conftest import require

    trl = require("trl")
    text = (Path(__file__).parents[2] / "docs" / "trainer.md").read_text()
    carried = text[text.index("A TRL config's loss knobs") : text.index("Not here:")]
    loss_types = {"grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"}  # not knobs
    listed = set(re.findall(r"`([a-z_]+)`", carried)) - loss_types
    ours = {f.name for f in dataclasses.fields(GRPOConfig)}
    trls = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert len(listed) > 30
    assert listed <= ours, sorted(listed - ours)
    assert listed <= trls, sorted(listed - trls)
    assert (ours & trls) <= listed, sorted((ours & trls) - listed)  # a new shared knob is listed


def test_the_coming_from_trl_config_in_the_docs_is_valid_and_its_defaults_hold() -> None:
    """docs/trainer.md's translation of a TRL run: its YAML builds, the defaults it names hold."""
    import re

    text = (Path(__file__).parents[2] / "docs" / "trainer.md").read_text()
    section = text[text.index("### Coming from TRL") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block is not None
    config = GRPOConfig.from_dict(yaml.safe_load(block.group(1)))
    assert (config.tasks_per_step, config.vllm_gpu_memory_utilization) == (8, 0.3)
    defaults = GRPOConfig.defaults()
    assert (defaults["learning_rate"], defaults["lr_scheduler_type"]) == (1e-5, "constant")
    assert defaults["vllm_importance_sampling_mode"] == "token_truncate"
    assert defaults["max_completion_length"] == 256

"""trainers._preflight: each refusal comes before a model loads, in one line naming the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym._errors import ConfigError
from envs.calculator import CalculatorEnv
from tests.conftest import model_with_template, require
from trainers._config import GRPOConfig
from trainers._memory import CpuEstimate, parameter_count
from trainers._preflight import _check_memory, preflight

SMALL_TASKS = {"env_kwargs": {"num_tasks": 40}, "train_tasks": "10:40", "eval_tasks": "0:10"}


def _refusal(config: GRPOConfig, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        preflight(config)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_env_suggests_the_close_id() -> None:
    _refusal(GRPOConfig(env="calculater", **SMALL_TASKS), "calculator")


def test_task_ranges_beyond_the_env_name_the_fix() -> None:
    config = GRPOConfig(env="calculator", env_kwargs={"num_tasks": 20}, train_tasks="10:40",
                        eval_tasks="0:10")  # fmt: skip
    _refusal(config, "leave them unset (null) to split the env's tasks, or pass a larger num_tasks")


def test_a_vllm_engine_without_vllm_installed_names_both_fixes(monkeypatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec  # vLLM is installed here: hide it from this check
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name)
    )
    _refusal(GRPOConfig(**SMALL_TASKS), "set rollout_engine: hf")
    preflight_ok = GRPOConfig(rollout_engine="hf", **SMALL_TASKS)
    assert preflight(preflight_ok).model_dir.is_dir()  # the transformers engine needs no vLLM


@pytest.mark.parametrize(
    ("knob", "value", "fragment"),
    [("loss_type", "bnpo", "loss_type"), ("num_generations", 1, "num_generations")],
)
def test_a_knob_set_on_the_config_after_it_was_made_is_checked(
    knob: str, value: Any, fragment: str
) -> None:
    """TRL users set knobs on the object; ``loss_type = "bnpo"`` trained with the dapo loss
    (config.yaml recorded bnpo), ``num_generations = 1`` trained on flat groups only."""
    config = GRPOConfig(**SMALL_TASKS)
    setattr(config, knob, value)
    _refusal(config, fragment)


def test_the_default_config_runs_on_the_default_env_splitting_its_tasks() -> None:
    # the README's GRPOConfig(model=..., env="calculator"): the env has 100 tasks by default
    checked = preflight(GRPOConfig(env="calculator"))
    assert checked.train_tasks == list(range(10, 100)) and checked.eval_tasks == list(range(10))
    _refusal(GRPOConfig(eval_tasks="0:150"), "reach task 149 but 'calculator' has 100 tasks")


class TasksElsewhere(agentgym.Env):
    """An env that takes its tasks from somewhere else (it has no ``tasks`` attribute)."""


def test_an_env_without_a_task_list_needs_both_ranges() -> None:
    agentgym.register("tests/NoTasks-v0", TasksElsewhere)
    _refusal(GRPOConfig(env="tests/NoTasks-v0"), "has no task list to split; set train_tasks")


def test_gdpo_reads_the_rubrics_weights_and_needs_a_rubric() -> None:
    checked = preflight(GRPOConfig(multi_objective_aggregation="normalize_then_sum",
                                   **SMALL_TASKS))  # fmt: skip
    assert checked.reward_weights == {"correct_answer": 1.0, "used_calculator": 0.0}
    agentgym.register("tests/NoRubric-v0", TasksElsewhere)
    config = GRPOConfig(env="tests/NoRubric-v0", train_tasks="4:8", eval_tasks=[0],
                        multi_objective_aggregation="normalize_then_sum")  # fmt: skip
    _refusal(config, "'normalize_then_sum' normalises each reward function of the env's Rubric")


def test_an_env_with_an_empty_task_list_is_refused() -> None:
    agentgym.register("tests/EmptyTasks-v0", lambda: agentgym.ToolEnv([]))
    _refusal(GRPOConfig(env="tests/EmptyTasks-v0"), "has no tasks with env_kwargs")


def test_a_path_that_is_not_a_model_folder_is_refused(tmp_path: Path) -> None:
    _refusal(GRPOConfig(model=str(tmp_path), **SMALL_TASKS), "no config.json")


def test_a_warm_start_script_the_env_lacks_is_refused_before_the_model() -> None:
    config = GRPOConfig(model="/nonexistent", sft_steps=5, **SMALL_TASKS,
                        sft_scripts={"reference": 0.5, "guess": 0.5})  # fmt: skip
    _refusal(config, "has no guess_turns")


def _without_tools(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny model with a chat template that renders no tools."""
    require("transformers")
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return model_with_template(tiny_model_dir, template, tmp_path / "model")


def test_a_template_that_drops_tools_is_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    model = _without_tools(tiny_model_dir, tmp_path)
    _refusal(GRPOConfig(model=str(model), **SMALL_TASKS), "or the env's tool_prompt='system'")


def test_the_fix_it_names_passes_the_env_lists_the_tools_itself(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """tool_prompt='system' was refused with the same error that named it as the fix."""
    model = _without_tools(tiny_model_dir, tmp_path)
    env_kwargs = {**SMALL_TASKS["env_kwargs"], "tool_prompt": "system"}  # type: ignore[dict-item]
    checked = preflight(GRPOConfig(model=str(model), **{**SMALL_TASKS, "env_kwargs": env_kwargs}))
    assert checked.model_dir == model


def test_a_warm_start_refuses_a_template_that_drops_calls_where_the_env_lists_the_tools(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The dry run passed it, then the warm start refused it (Phi-4-mini's, Granite 3.3's and
    SmolLM2's templates write an assistant turn's content only). Without a warm start the
    sampled tokens are what trains, and it passes as before."""
    model = _without_tools(tiny_model_dir, tmp_path)
    env_kwargs = {**SMALL_TASKS["env_kwargs"], "tool_prompt": "system"}  # type: ignore[dict-item]
    listed = {**SMALL_TASKS, "env_kwargs": env_kwargs}
    _refusal(GRPOConfig(model=str(model), sft_steps=10, **listed),
             "the template drops the turn's tool calls")  # fmt: skip
    assert preflight(GRPOConfig(model=str(model), **listed)).model_dir == model


#: Renders the tools, as the real Llama 3.1 and Mistral v0.3 templates do (these do not).
_SHOW_TOOLS = (
    "{%- for tool in tools or [] %}{{- 'Tool: ' + tool.function.name + '\\n' }}{%- endfor %}"
)


@pytest.mark.parametrize(
    ("family", "parser"),
    [("llama", "llama3_json"), ("mistral", "mistral")],
)
def test_a_template_whose_call_format_the_parser_does_not_read_is_refused_naming_the_parser(
    tmp_path: Path, tiny_model_dir: Path, family: str, parser: str
) -> None:
    """A pretrained model writes its template's format: under the default hermes parser a
    Llama 3.1 model's calls read as plain text (the run trained on episodes calling nothing),
    and a Mistral template cannot render the ids hermes gives (the rollouts failed later)."""
    from tests.test_check_families import LLAMA31_LIKE, MISTRAL_V03_LIKE

    template = {"llama": LLAMA31_LIKE, "mistral": MISTRAL_V03_LIKE}[family]
    model = model_with_template(tiny_model_dir, _SHOW_TOOLS + template, tmp_path / family)
    _refusal(GRPOConfig(model=str(model), **SMALL_TASKS), f"use --env-arg parser={parser}")
    env_kwargs = {**SMALL_TASKS["env_kwargs"], "parser": parser}  # type: ignore[dict-item]
    checked = preflight(GRPOConfig(model=str(model), **{**SMALL_TASKS, "env_kwargs": env_kwargs}))
    assert checked.model_dir == model  # the fix it names passes


def test_the_tiny_models_hermes_calls_are_refused_under_another_parser(
    tiny_model_dir: Path,
) -> None:
    _refusal(GRPOConfig(model=str(tiny_model_dir), **{**SMALL_TASKS, "env_kwargs": {
        "num_tasks": 40, "parser": "llama3_json"}}), "use --env-arg parser=hermes")  # fmt: skip


def test_an_opening_prompt_longer_than_the_context_is_refused_before_the_engine(
    tiny_model_dir: Path,
) -> None:
    """It passed the dry run and failed after the engine started, leaving a failed run folder
    that neither a new run nor --resume (config changed) would take."""
    config = GRPOConfig(model=str(tiny_model_dir), max_model_len=200, max_completion_length=100,
                        **SMALL_TASKS)  # fmt: skip
    _refusal(config, "the env's opening prompt is ")
    _refusal(config, "and max_model_len is 200: every episode would end before its first turn; "
                     "raise max_model_len (--set max_model_len=N)")  # fmt: skip
    assert preflight(GRPOConfig(model=str(tiny_model_dir), max_model_len=1024, **SMALL_TASKS))


def test_a_model_too_big_for_this_machine_is_refused_on_the_cpu(tmp_path: Path) -> None:
    spec = {"hidden_size": 16384, "num_hidden_layers": 200, "vocab_size": 150000}
    (tmp_path / "config.json").write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match=r"GiB to train on the CPU.*use device: cuda"):
        _check_memory(tmp_path, GRPOConfig(device="cpu"))


def test_a_full_warm_start_that_cannot_fit_beside_the_engine_is_refused_naming_lora(
    tmp_path: Path,
) -> None:
    """GRPO holds two float32 copies of the weights (8 bytes a parameter); a full-weight warm
    start holds weights, gradients and AdamW's moments (16) beside the engine's copy (4). A
    model sized between the two used to pass the check and run out of memory in the SFT."""
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    hidden = 1024  # a layer is 16 * hidden**2 parameters (attention 4, gated MLP 12)
    layers = round(have / 12 / (16 * hidden * hidden))  # ~12 bytes a parameter fill it
    (tmp_path / "config.json").write_text(
        json.dumps({"hidden_size": hidden, "num_hidden_layers": layers, "vocab_size": 0})
    )
    _check_memory(tmp_path, GRPOConfig(device="cpu"))  # GRPO alone fits
    full = GRPOConfig(device="cpu", sft_steps=4)
    with pytest.raises(ConfigError, match=r"peak in the SFT warm start: weights, gradients and "
                       r"AdamW state, beside the engine's copy\), this machine has .* GiB; use "
                       r"device: cuda, sft_method: lora or a smaller model"):  # fmt: skip
        _check_memory(tmp_path, full)
    _check_memory(tmp_path, GRPOConfig(device="cpu", sft_steps=4, sft_method="lora"))
    assert CpuEstimate.of(tmp_path, full, world_size=2).need == 16 * parameter_count(tmp_path)


class CountedCalculator(CalculatorEnv):
    """The calculator, keeping every instance so a test can see which were built and closed."""

    built: list[CountedCalculator] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.closed = False
        CountedCalculator.built.append(self)

    async def aclose(self) -> None:
        self.closed = True
        await super().aclose()


@pytest.fixture
def counted() -> list[CountedCalculator]:
    agentgym.register("tests/CountedCalculator-v0", CountedCalculator)
    CountedCalculator.built.clear()
    return CountedCalculator.built


def test_the_trainer_builds_its_env_once_at_start_up_as_the_run_plays_it(counted) -> None:
    from trainers import GRPOTrainer

    config = GRPOConfig(env="tests/CountedCalculator-v0", rollout_engine="hf", max_turns=3,
                        **SMALL_TASKS)  # fmt: skip
    trainer = GRPOTrainer(config)
    assert len(counted) == 1 and counted[0].closed  # preflight's env serves the trainer too
    assert counted[0].max_turns == 3 and trainer.env_max_turns == 3  # with the run's max_turns
    assert [t["function"]["name"] for t in trainer.tools] == ["calculate"]


def test_oracle_traces_close_every_env_they_build(counted) -> None:
    from trainers._sft import oracle_conversations

    conversations, _ = oracle_conversations("tests/CountedCalculator-v0", {"num_tasks": 4})
    assert len(conversations) == 4
    assert counted and all(env.closed for env in counted)

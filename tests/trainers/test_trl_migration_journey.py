"""A TRL GRPOTrainer user moving a run here: every TRL key gets a fix, the docs' arithmetic holds.

The journey: a ``trl.GRPOConfig`` (and ``ModelConfig``/``ScriptArguments``) file fed to
``agentgym train``, its batch sizes and step counts translated by docs/trainer.md's "Coming from
TRL", and a reward function written for TRL brought over through the doc's adapter.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import pytest

import agentgym
from agentgym import ConfigError
from agentgym.trainers._config import GRPOConfig
from trainers._trl_keys import TRL_KEYS, TRL_KEYS_WITHOUT_KNOB

DOC = Path(__file__).parents[2] / "docs" / "trainer.md"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("### Coming from TRL")
    return text[start : text.index("\n## ", start)]


def _refusal(key: str, value: object = 1) -> str:
    with pytest.raises(ConfigError) as info:
        GRPOConfig.from_dict({key: value})
    return str(info.value)


def test_no_trl_key_is_answered_with_the_closest_spelling_of_an_unrelated_knob() -> None:
    """``adam_epsilon`` was met with "did you mean 'epsilon'?", the policy-ratio clip."""
    from tests.conftest import require

    trl = require("trl")
    ours = {f.name for f in dataclasses.fields(GRPOConfig)}
    theirs = {f.name for config in (trl.GRPOConfig, trl.ModelConfig, trl.ScriptArguments)
              for f in dataclasses.fields(config)}  # fmt: skip
    renamed = {"vllm_importance_sampling_cap"}  # forwarded with a FutureWarning
    fall_through = [key for key in sorted(theirs - ours - renamed)
                    if "it is TRL's; here" not in _refusal(key)]  # fmt: skip
    assert not fall_through, fall_through
    assert not set(TRL_KEYS) & TRL_KEYS_WITHOUT_KNOB
    assert TRL_KEYS_WITHOUT_KNOB <= theirs, sorted(TRL_KEYS_WITHOUT_KNOB - theirs)


@pytest.mark.parametrize(
    ("key", "fix"),
    [("adam_epsilon", "not Adam's"), ("model_init_kwargs", "set dtype"),
     ("deepspeed", "torchrun"), ("lora_task_type", "causal-LM"),
     ("dataset_train_split", "set env, train_tasks"), ("vllm_model_impl", "rollout_engine"),
     ("eval_on_start", "always runs"), ("load_in_8bit", "load_in_4bit"),
     ("disable_dropout", "no knob does that")],
)  # fmt: skip
def test_a_trl_key_that_once_got_a_wrong_suggestion_names_the_right_fix(key: str, fix: str) -> None:
    message = _refusal(key)
    assert "did you mean" not in message
    assert fix in message


def test_each_trl_hint_reads_as_one_clause_after_here() -> None:
    """ "it is TRL's; here the sampling knobs here are ..." said "here" twice."""
    for key in [*TRL_KEYS, *sorted(TRL_KEYS_WITHOUT_KNOB)[:3]]:
        message = _refusal(key)
        assert message.count(" here") == 1, message


def test_the_batch_size_hint_and_the_docs_translate_trl_batches_that_add_up() -> None:
    """TRL's per-device batch x accumulation = completions a step = tasks_per_step x G here."""
    from tests.conftest import require

    trl = require("trl")
    message = _refusal("per_device_train_batch_size", 8)
    assert "gradient_accumulation_steps" in message and "/ num_generations" in message
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = trl.GRPOConfig(output_dir="out", per_device_train_batch_size=8,
                                gradient_accumulation_steps=4, num_generations=8,
                                report_to="none", use_cpu=True, bf16=False)  # fmt: skip
    ours = GRPOConfig(num_generations=8, tasks_per_step=4, gradient_accumulation_steps=4,
                      report_to=["none"])  # fmt: skip
    assert theirs.generation_batch_size == ours.episodes_per_step == 32
    section = _section()
    assert "8 x 4 x 1 = 32 completions" in section and "`tasks_per_step: 4`" in section


def test_the_docs_say_how_step_counts_move_with_num_iterations() -> None:
    """TRL's max_steps counts updates (num_iterations a generation); ours counts GRPO steps."""
    config = GRPOConfig(num_iterations=2, max_steps=100, save_steps=25, report_to=["none"])
    assert config.max_steps * config.num_iterations == 200  # TRL's max_steps=200
    section = _section()
    assert "TRL's `max_steps=200` (100 generations) is `max_steps: 100`" in section
    assert "`save_steps=50` is `save_steps: 25`" in section


def test_max_tool_calling_iterations_becomes_max_turns_plus_the_answer_turn() -> None:
    """TRL runs the tools N times and generates after each: N + 1 assistant turns."""
    assert "set max_turns to it + 1" in _refusal("max_tool_calling_iterations", 3)
    assert re.search(r"max_turns: 4 +# max_tool_calling_iterations, plus", _section())


def test_the_docs_adapter_brings_a_trl_reward_function_over() -> None:
    blocks = re.findall(r"```python\n(.*?)```", _section(), re.DOTALL)
    adapter = next(block for block in blocks if "def from_trl" in block)
    scope: dict[str, object] = {}
    exec(compile(adapter, str(DOC), "exec"), scope)  # noqa: S102 - the doc's own example
    rubric = scope["rubric"]
    assert isinstance(rubric, agentgym.Rubric) and rubric.names == ["correct_answer"]

    @agentgym.tool
    def lookup(city: str) -> str:
        """Return the country a city is in.

        Args:
            city: the city's English name.
        """
        return {"Lima": "Peru"}.get(city, "unknown")

    tasks = [{"prompt": "Which country is Lima in?", "answer": "Peru"}]
    env = agentgym.ToolEnv([lookup], tasks=tasks, rubric=rubric)
    env.reset(seed=0)
    env.step('<tool_call>{"name": "lookup", "arguments": {"city": "Lima"}}</tool_call>')
    *_, info = env.step("It is Peru.")
    assert info["scores"] == {"correct_answer": 1.0} and not info["reward_errors"]
    with pytest.raises(ConfigError, match="completions"):  # as written for TRL, refused
        agentgym.Rubric([scope["correct_answer"]])  # type: ignore[list-item]


def test_every_trl_key_of_a_file_is_named_in_one_error() -> None:
    """A TRL file with ten TRL-only keys took ten runs, one refused key each."""
    trl_file = {"model_name_or_path": "tiny", "per_device_train_batch_size": 8, "bf16": True,
                "use_peft": True, "env": "calculator", "max_stepz": 3}  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        GRPOConfig.from_dict(trl_file)
    message = str(refused.value)
    assert message.startswith("5 unknown config keys: ") and "\n" not in message
    for key, fix in (("model_name_or_path", "set model"), ("bf16", "set dtype: bfloat16"),
                     ("per_device_train_batch_size", "set tasks_per_step"),
                     ("use_peft", "LoRA is always on"), ("max_stepz", "did you mean 'max_steps'")):
        assert f"'{key}'; " in message and fix in message  # fmt: skip


def test_a_trl_reward_function_given_as_it_is_points_at_the_adapter() -> None:
    def accuracy(completions, answer, **kwargs):  # type: ignore[no-untyped-def]
        return [1.0 for _ in completions]

    with pytest.raises(ConfigError, match=r"asks for \['completions'\].*TRL reward function"):
        agentgym.Rubric([accuracy])

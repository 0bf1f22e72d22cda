"""The rollout engine's answers to the mistakes users make: one clear `ConfigError` naming the
fix, raised before the slow engine start where possible, and nothing lost (the engine, the
loaded adapter, the model's weights stay as they were).

Cheap checks first (no model); then HFPolicy on the tiny model; then `VLLMPolicy` refusals
that must come before its engine starts (no engine is started for them).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError, ContextLengthError
from agentgym._seeds import turn_seed
from agentgym.engine import HFPolicy, SamplingConfig, TokenPolicy
from agentgym.engine._model_dir import context_length
from tests.conftest import require
from tests.engine.episodes import make_adapter

# ---- SamplingConfig -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("knobs", "says"),
    [
        ({"top_k": -5}, "top_k must be an int >= 1, or 0 / -1"),  # was silently "no top-k"
        ({"top_k": 2.5}, "top_k must be an int"),
        ({"max_tokens": 2.5}, "max_tokens must be an int >= 1"),
        ({"max_tokens": "128"}, "max_tokens must be an int >= 1"),  # was a TypeError
        ({"max_tokens": True}, "max_tokens must be an int >= 1"),
        ({"temperature": "0.7"}, "temperature must be a number"),  # was a TypeError
        ({"top_p": None}, "top_p must be a number"),
        ({"seed": 1.5}, "seed must be an int or None"),
        ({"stop": [1]}, "stop must be a list of non-empty strings"),
        ({"stop": [""]}, "stop must be a list of non-empty strings"),
        ({"stop": 7}, "stop must be a list of non-empty strings"),
        ({"extra": [("ignore_eos", True)]}, "extra must be a dict"),
        ({"extra": {"temperature": 0.3}}, "extra sets 'temperature', which the engine sets"),
        ({"extra": {"logprobs": 5, "n": 4}}, "extra sets 'logprobs', 'n', which the engine"),
        ({"temperature": -1}, "sampling needs a finite temperature"),
        ({"top_p": 0}, "sampling needs a finite temperature"),
        ({"top_p": 1.5}, "sampling needs a finite temperature"),
        ({"min_p": 1.5}, "sampling needs a finite temperature"),
        ({"top_p": math.nan}, "sampling needs a finite temperature"),
        ({"max_tokens": 0}, "max_tokens must be an int >= 1"),
    ],
)
def test_a_knob_no_sampler_can_use_is_one_config_error(knobs: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=f"^{_escaped(says)}"):
        SamplingConfig(**knobs)
    with pytest.raises(ConfigError, match=f"^{_escaped(says)}"):
        TokenPolicy().with_sampling(**knobs)  # a view is checked as the policy is


def _escaped(text: str) -> str:
    return re.escape(text)


def test_a_turn_cut_below_min_tokens_samples_what_it_may() -> None:
    """A turn cut to the episode's budget asked vLLM for more min_tokens than max_tokens:
    refused per request, the episode ended ``error``."""
    sampling = SamplingConfig(max_tokens=40, extra={"min_tokens": 30, "ignore_eos": True})
    assert sampling.extra_for(40) is sampling.extra
    assert sampling.extra_for(10) == {"min_tokens": 10, "ignore_eos": True}
    assert sampling.extra == {"min_tokens": 30, "ignore_eos": True}  # the config keeps its own


def test_a_spent_token_budget_ends_the_episode_truncated_not_at_the_full_limit() -> None:
    """A limit of 0 was read as "not given" (the policy's full max_tokens); -3 was vLLM's
    error, the episode ``error``."""
    policy = TokenPolicy(sampling={"max_tokens": 16})
    assert policy.turn_limit([1, 2], None, policy.sampling) == 16
    assert policy.turn_limit([1, 2], 5, policy.sampling) == 5
    for spent in (0, -3):
        with pytest.raises(ContextLengthError, match="token budget is spent"):
            policy.turn_limit([1, 2], spent, policy.sampling)


@pytest.mark.parametrize("base", [2**64, 2 * 10**16, -1, -(2**70)])
def test_every_turn_seed_is_one_a_sampler_takes(base: int) -> None:
    """vLLM could not send a seed past 2**64 - 1 (``--seed 2e16``: every episode an
    infra_error) and read -1 as no seed at all (runs that did not repeat)."""
    seeds = {turn_seed(base, episode, turn) for episode in (0, 7, 10**9) for turn in (0, 1)}
    assert all(seed is not None and 0 <= seed < 2**63 for seed in seeds)
    assert len(seeds) == 6  # still one per (episode, turn)
    assert turn_seed(5, 2, 1) == 2006  # the documented formula where it fits


def test_one_stop_string_is_one_stop_string_not_its_characters() -> None:
    # list("</tool_call>") reached vLLM as 11 one-character stop strings: every turn ended at "<"
    assert SamplingConfig(stop="</tool_call>").stop == ["</tool_call>"]
    assert TokenPolicy({"stop": "</tool_call>"}).sampling.stop == ["</tool_call>"]
    assert TokenPolicy().with_sampling(stop="</a>").sampling.stop == ["</a>"]
    assert SamplingConfig(stop=("</a>", "</b>")).stop == ["</a>", "</b>"]
    assert SamplingConfig(stop=None).stop == []


def test_sampling_that_is_not_a_dict_is_refused_not_kept() -> None:
    with pytest.raises(ConfigError, match="sampling must be a SamplingConfig or a dict"):
        TokenPolicy([("temperature", 0.5)])  # type: ignore[arg-type]


def test_a_misspelt_knob_in_with_sampling_names_the_one_meant() -> None:
    with pytest.raises(ConfigError, match=r"unknown sampling knob 'temprature'; did you mean"):
        TokenPolicy().with_sampling(temprature=0.0)  # was dataclasses.replace's TypeError


@pytest.mark.parametrize("length", [0, -5, 2.5, "1024"])
def test_a_context_window_below_one_token_is_refused(length: Any, tmp_path: Path) -> None:
    # vLLM refused 0 only after its engine had started, as an engine failure
    with pytest.raises(ConfigError, match="max_model_len must be an int >= 1"):
        context_length(tmp_path, length)


# ---- HFPolicy on the tiny model -----------------------------------------------------------


@pytest.mark.slow
def test_hf_views_refuse_knobs_generate_would_ignore(tiny_model_dir: Path) -> None:
    policy = HFPolicy(tiny_model_dir, sampling={"max_tokens": 4})
    for knobs in ({"min_p": 0.5}, {"extra": {"ignore_eos": True}}):
        with pytest.raises(ConfigError, match="HFPolicy supports neither min_p nor extra"):
            policy.with_sampling(**knobs)  # sampled without them, silently
        with pytest.raises(ConfigError, match="HFPolicy supports neither min_p nor extra"):
            policy.with_sampling(temperature=0.5).with_sampling(**knobs)


@pytest.mark.slow
def test_a_chat_template_kwarg_the_template_never_reads_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="the template never reads 'enable_thinkng'"):
        HFPolicy(tiny_model_dir, chat_template_kwargs={"enable_thinkng": False})
    with pytest.raises(ConfigError, match="chat_template_kwargs must be a dict"):
        HFPolicy(tiny_model_dir, chat_template_kwargs=["enable_thinking"])  # type: ignore[arg-type]


@pytest.mark.slow
def test_hf_dtype_typo_is_one_config_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="dtype must name a torch dtype"):
        HFPolicy(tiny_model_dir, dtype="fp32")  # was AttributeError: module torch has no 'fp32'


@pytest.fixture(scope="module")
def other_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model of another width (256), and an adapter trained on it."""
    require("peft")
    from agentgym.engine.tiny import build_tiny_model, save_random_adapter

    out = tmp_path_factory.mktemp("other-base")
    model = build_tiny_model(out / "model", hidden_size=256, num_heads=4)
    return save_random_adapter(model, out / "adapter", rank=8)


@pytest.mark.slow
def test_hf_adapter_of_another_base_model_is_refused_and_loses_nothing(
    tiny_model_dir: Path, other_base: Path, tmp_path: Path
) -> None:
    import asyncio

    policy = HFPolicy(tiny_model_dir, sampling={"temperature": 0.0, "max_tokens": 8})
    prompt = policy.tokenizer.encode("hello there")
    base = asyncio.run(policy.generate_ids(prompt)).completion_ids
    with pytest.raises(ConfigError, match="does not fit the model in .*: its .* width 256"):
        policy.load_adapter(other_base)
    assert type(policy.model).__name__ != "PeftModel"  # PEFT had added its layers, then failed
    assert asyncio.run(policy.generate_ids(prompt)).completion_ids == base
    assert policy.load_adapter(make_adapter(tiny_model_dir, tmp_path / "mine", seed=1)) == 1
    with pytest.raises(ConfigError, match="does not fit the model"):
        policy.load_adapter(other_base)  # into a loaded slot: the slot keeps serving version 1
    assert asyncio.run(policy.served_adapters()) == {1}
    assert asyncio.run(policy.generate_ids(prompt)).adapter_version == 1
    with pytest.raises(ConfigError, match="does not fit the model"):
        HFPolicy(tiny_model_dir, adapter=other_base)


# ---- VLLMPolicy: refused before its engine starts -----------------------------------------


@pytest.fixture
def vllm_policy_class() -> Any:
    require("vllm")
    from agentgym.engine import VLLMPolicy

    return VLLMPolicy


@pytest.mark.vllm
@pytest.mark.slow
def test_adapter_mistakes_are_refused_before_the_engine_starts(
    vllm_policy_class: Any, tiny_model_dir: Path, other_base: Path, tmp_path: Path
) -> None:
    from agentgym.engine.tiny import save_random_adapter

    policy = vllm_policy_class(tiny_model_dir, enable_lora=True, max_lora_rank=8)
    rank16 = save_random_adapter(tiny_model_dir, tmp_path / "r16", rank=16)
    with pytest.raises(ConfigError, match="not a PEFT adapter folder"):
        policy.load_adapter(tmp_path / "missing")
    with pytest.raises(ConfigError, match="not a PEFT adapter folder"):
        policy.load_adapter(rank16 / "adapter_config.json")  # a file, not its folder
    with pytest.raises(ConfigError, match="has LoRA rank 16, above this engine's max_lora_rank=8; "
                       "start the VLLMPolicy with max_lora_rank=16"):  # fmt: skip
        policy.load_adapter(rank16)
    with pytest.raises(ConfigError, match="does not fit the model"):
        policy.load_adapter(other_base)
    config = rank16 / "adapter_config.json"  # rank-16 weights under a config saying 8
    config.write_text(json.dumps({**json.loads(config.read_text()), "r": 8}))
    with pytest.raises(ConfigError, match="holds LoRA weights of rank 16, but its "
                       "adapter_config.json gives rank 8; save config and weights together"):
        policy.load_adapter(rank16)  # it failed in vLLM's worker, some 75 lines
    assert policy._engine is None, "the engine was started for a load that could not work"
    assert policy.adapters == [] and policy.adapter_version == 0
    policy.close()


def _broken_adapters(plain: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Copies of ``plain`` broken as users' folders were, each with the error it must get."""

    def copy(name: str) -> Path:
        return Path(shutil.copytree(plain, root / name))

    no_weights, cut, not_json = copy("no-weights"), copy("cut"), copy("not-json")
    (no_weights / "adapter_model.safetensors").unlink()
    weights = cut / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (not_json / "adapter_config.json").write_text("{not json")
    return {
        "no weights": (no_weights, "holds no adapter weights .*save the adapter again"),
        "cut weights": (cut, "is cut short or not safetensors; save the adapter again"),
        "config not JSON": (not_json, "cannot be read as JSON .*save the adapter again"),
    }


def _unservable_adapters(plain: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Copies of ``plain`` whose config asks for what vLLM does not serve (PEFT does)."""
    cases = {
        "DoRA": ({"use_dora": True}, "is a DoRA adapter"),
        "biases": ({"bias": "lora_only"}, "trains biases"),
        "whole modules": ({"modules_to_save": ["lm_head"]}, "saves whole modules"),
        "head": ({"target_modules": ["q_proj", "lm_head"]}, r"adapts \['lm_head'\]"),
    }
    out = {}
    for name, (fields, error) in cases.items():
        folder = Path(shutil.copytree(plain, root / name))
        config = folder / "adapter_config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), **fields}))
        out[name] = (folder, f"vLLM cannot serve the adapter at .*: it {error}")
    return out


@pytest.mark.vllm
@pytest.mark.slow
def test_adapters_vllm_would_refuse_in_its_engine_are_refused_before_it_starts(
    vllm_policy_class: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Each was a `ModelError` (an infra failure: `agentgym eval` exit 75, for a queue to
    retry) raised after the engine's start, with some 75 lines of worker tracebacks."""
    plain = make_adapter(tiny_model_dir, tmp_path / "plain", seed=1)
    policy = vllm_policy_class(tiny_model_dir, enable_lora=True, max_lora_rank=8)
    cases = _broken_adapters(plain, tmp_path) | _unservable_adapters(plain, tmp_path)
    for folder, error in cases.values():
        with pytest.raises(ConfigError, match=error):
            policy.load_adapter(folder)
    assert policy._engine is None
    policy.close()


@pytest.mark.slow
def test_hf_refuses_a_broken_adapter_folder_with_the_fix(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    plain = make_adapter(tiny_model_dir, tmp_path / "plain", seed=1)
    policy = HFPolicy(tiny_model_dir)
    for folder, error in _broken_adapters(plain, tmp_path).values():
        with pytest.raises(ConfigError, match=error):
            policy.load_adapter(folder)
    assert policy.adapter_version == 0 and type(policy.model).__name__ != "PeftModel"


@pytest.mark.vllm
@pytest.mark.slow
def test_a_closed_policy_is_not_silently_restarted(
    vllm_policy_class: Any, tiny_model_dir: Path
) -> None:
    import agentgym
    from tests.engine.episodes import NudgeEnv

    policy = vllm_policy_class(tiny_model_dir)
    greedy = policy.with_sampling(temperature=0.0)
    policy.close()
    policy.close()  # twice: nothing to do
    for use in (policy.start, lambda: policy.renderer, lambda: policy.max_num_seqs):
        with pytest.raises(ConfigError, match="this VLLMPolicy was closed.*make a new VLLMPolicy"):
            use()  # each started a second engine that nothing closed
    with pytest.raises(ConfigError, match="this VLLMPolicy was closed"):
        agentgym.rollout(NudgeEnv, greedy, tasks=[{"id": 1}])  # a view: every episode an error
    assert policy._engine is None


@pytest.mark.vllm
@pytest.mark.slow
def test_a_head_size_vllm_cpu_cannot_run_is_refused_before_the_engine_starts(
    vllm_policy_class: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the head-size limit is vLLM-CPU's")
    model = tmp_path / "head16"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config.update(num_attention_heads=8, num_key_value_heads=2, head_dim=16)
    (model / "config.json").write_text(json.dumps(config))
    policy = vllm_policy_class(model)
    with pytest.raises(ConfigError, match="head size 16, which vLLM's CPU build cannot run"):
        policy.start()  # was "Engine core initialization failed" after the engine's start
    assert policy._engine is None


@pytest.mark.vllm
@pytest.mark.slow
def test_an_unread_template_kwarg_is_refused_before_the_engine_starts(
    vllm_policy_class: Any, tiny_model_dir: Path
) -> None:
    policy = vllm_policy_class(tiny_model_dir, chat_template_kwargs={"enable_thinkng": False})
    with pytest.raises(ConfigError, match="the template never reads 'enable_thinkng'"):
        policy.start()
    assert policy._engine is None


@pytest.mark.vllm
@pytest.mark.slow
def test_engine_option_typos_are_config_errors_not_engine_failures(
    vllm_policy_class: Any, tiny_model_dir: Path
) -> None:
    # each came out of start() as ModelError ("vLLM could not start"): an infra failure that
    # `agentgym eval` reports with exit 75, for a queue to retry
    with pytest.raises(ConfigError, match="dtype must be one of"):
        vllm_policy_class(tiny_model_dir, dtype="fp32")
    policy = vllm_policy_class(tiny_model_dir, engine_kwargs={"max_num_seq": 4})
    with pytest.raises(ConfigError, match="'max_num_seq' is not a field of vllm.AsyncEngineArgs; "
                       "did you mean 'max_num_seqs'"):  # fmt: skip
        policy.start()
    assert policy._engine is None
    # a misspelt SamplingParams field failed every turn of every episode, one traceback each
    with pytest.raises(ConfigError, match="vLLM's SamplingParams refuses it"):
        vllm_policy_class(tiny_model_dir, sampling={"extra": {"ignore_eoss": True}})
    with pytest.raises(ConfigError, match="vLLM's SamplingParams refuses it"):
        vllm_policy_class(tiny_model_dir).with_sampling(extra={"repetition_penalty": -1.0})
    # checked against the turn's own limit: min_tokens above 1 was refused (checked with 1)
    vllm_policy_class(tiny_model_dir).with_sampling(max_tokens=40, extra={"min_tokens": 30})
    # ids outside the vocabulary: vLLM checks them per request, so every episode an error
    for extra in ({"allowed_token_ids": [5, 99999]}, {"logit_bias": {"-1": 2.0}},
                  {"stop_token_ids": [261]}):  # fmt: skip
        with pytest.raises(ConfigError, match=r"holds token ids \[.*\] outside the model's "
                           r"vocabulary \(0-260\); fix those ids"):  # fmt: skip
            vllm_policy_class(tiny_model_dir, sampling={"extra": extra})


# ---- a context window below the env's opening prompt (Python API) --------------------------


async def test_an_episode_whose_opening_fills_the_context_says_how_to_fix_it() -> None:
    """`agentgym eval` and the trainer refuse such a window up front; `arollout` with a policy
    built in Python truncates each episode before its first turn (the documented behaviour),
    and the reason it records must name the knob to change."""
    from agentgym import ToolEnv, arollout, tool
    from tests.engine.episodes import IdsPolicy

    @tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    def env() -> ToolEnv:
        return ToolEnv([echo], tasks=[{"prompt": "say hi", "answer": "hi"}], max_turns=2)

    policy = IdsPolicy([[1]], max_model_len=16)
    [trajectory] = await arollout(env, policy, tasks=[0])
    assert trajectory.status == "truncated" and trajectory.turns == []
    assert "raise max_model_len" in trajectory.info["truncated_by"]


# ---- VLLMPolicy: one engine, refusals it answers and a close mid-rollout --------------------


@pytest.mark.vllm
@pytest.mark.engine
@pytest.mark.slow
async def test_an_engine_refusal_and_a_close_mid_rollout_lose_nothing(
    vllm_policy_class: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import asyncio
    import threading

    import agentgym
    from agentgym import ModelError

    policy = vllm_policy_class(
        tiny_model_dir, sampling={"max_tokens": 1000, "extra": {"ignore_eos": True}},
        max_model_len=2048, enable_lora=True, max_lora_rank=8,
    )  # fmt: skip
    try:
        good = make_adapter(tiny_model_dir, tmp_path / "good", seed=1)
        assert policy.load_adapter(good) == 1
        broken = make_adapter(tiny_model_dir, tmp_path / "broken", seed=2,
                              targets=["q_proj", "lm_head"])  # fmt: skip
        config = broken / "adapter_config.json"  # targets as a pattern: left to vLLM to refuse
        config.write_text(json.dumps({**json.loads(config.read_text()),
                                      "target_modules": "(q_proj|lm_head)"}))  # fmt: skip
        refused = _escaped(f"vLLM refused to load the adapter at {broken}")
        with pytest.raises(ModelError, match=refused):
            policy.load_adapter(broken)  # was a bare Exception("Call to add_lora ...")
        assert policy.adapter_version == 1 and [a.version for a in policy.adapters] == [1]

        threads = set(threading.enumerate())
        rollout = asyncio.ensure_future(agentgym.arollout("calculator", policy, num_tasks=4))
        while not any(policy._in_flight.values()):  # a turn is in the engine
            assert not rollout.done(), rollout
            await asyncio.sleep(0.01)
        await asyncio.to_thread(policy.close)
        trajectories = await asyncio.wait_for(rollout, 60)  # was: CancelledError, none returned
    finally:
        policy.close()
    assert len(trajectories) == 4
    closed = [t for t in trajectories if t.status == "infra_error"]
    assert closed, [t.status for t in trajectories]
    assert all("shut down (VLLMPolicy.close) during this call" in t.error for t in closed)
    left = {t.name for t in set(threading.enumerate()) - threads}
    assert {name for name in left if not name.startswith("asyncio_")} == set()  # (to_thread's)


@pytest.mark.slow
def test_hf_adapter_of_a_deeper_model_of_the_same_width_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Same widths, two more layers (the quickstart model is 4 layers of the test model's
    width): its layers 2 and 3 were dropped without a word."""
    from agentgym.engine.tiny import build_tiny_model

    deeper = build_tiny_model(tmp_path / "deeper", num_layers=4)
    adapter = make_adapter(deeper, tmp_path / "adapter", seed=1)  # q_proj, v_proj: same widths
    policy = HFPolicy(tiny_model_dir, sampling={"max_tokens": 4})
    with pytest.raises(ConfigError, match="adapts layer 2, and the model has 2 layers"):
        policy.load_adapter(adapter)
    assert policy.adapter_version == 0 and type(policy.model).__name__ != "PeftModel"

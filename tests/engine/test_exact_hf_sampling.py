"""`HFPolicy` samples exactly the distribution `SamplingConfig` names, and reports its logprobs.

The trainer compares the engine's logprobs with its own forward pass (importance sampling), so
nothing the config does not name may change the distribution: not a ``repetition_penalty``
from the model folder's ``generation_config.json`` (Qwen2.5-Instruct ships 1.05), and a
documented knob (``top_k=-1``: no top-k) must not fail every turn. And a turn ends where vLLM
would end it: on the EOS ids of ``generation_config.json`` as well as the tokenizer's.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from agentgym.engine import HFPolicy
from tests.conftest import require

pytestmark = pytest.mark.slow


def _sample(policy: HFPolicy) -> tuple[list[int], list[int], list[float]]:
    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "say abc abc abc"}], None)
    completion = asyncio.run(policy.generate_ids(prompt, seed=3))
    return prompt, completion.completion_ids or [], completion.logprobs or []


@pytest.mark.parametrize("top_k", [-1, 0])
def test_top_k_off_samples(tiny_model_dir: Path, top_k: int) -> None:
    policy = HFPolicy(tiny_model_dir, sampling={"top_k": top_k, "max_tokens": 6})
    _, ids, logprobs = _sample(policy)
    assert len(ids) == len(logprobs) >= 1


def test_the_model_folders_generation_defaults_do_not_change_sampling(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "generation_config.json").read_text())
    config |= {"repetition_penalty": 3.0, "no_repeat_ngram_size": 1, "top_k": 3, "top_p": 0.5}
    (model / "generation_config.json").write_text(json.dumps(config))
    policy = HFPolicy(model, sampling={"temperature": 1.0, "max_tokens": 24})

    prompt, ids, logprobs = _sample(policy)

    assert len(ids) == len(logprobs) >= 1
    # the logprobs of the plain model at temperature 1, as the trainer computes them
    assert logprobs == pytest.approx(policy.token_logprobs(prompt, ids), abs=1e-4)


def _with_generation_eos(tiny_model_dir: Path, tmp_path: Path, extra: int) -> Path:
    """A copy of the tiny model whose generation_config.json lists ``extra`` as an EOS too."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "generation_config.json").read_text())
    config["eos_token_id"] = [config["eos_token_id"], extra]
    (model / "generation_config.json").write_text(json.dumps(config))
    return model


def test_stop_tokens_are_the_ones_vllm_stops_on(tiny_model_dir: Path, tmp_path: Path) -> None:
    require("vllm")
    from vllm import SamplingParams

    model = _with_generation_eos(tiny_model_dir, tmp_path, extra=7)
    policy = HFPolicy(model)
    vllm_stops = SamplingParams()
    vllm_stops.update_from_generation_config(
        json.loads((model / "generation_config.json").read_text()),
        policy.renderer.tokenizer.eos_token_id,
    )

    assert policy.renderer.stop_token_ids == set(vllm_stops.all_stop_token_ids) == {
        policy.renderer.tokenizer.eos_token_id,
        7,
    }


def test_a_turn_ends_on_an_eos_of_the_generation_config(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """vLLM ends a turn there (Qwen2.5's ``<|endoftext|>``); so must the HF engine."""
    greedy = {"temperature": 0.0, "max_tokens": 6}
    _, ids, _ = _sample(HFPolicy(tiny_model_dir, sampling=greedy))
    assert len(ids) >= 3, "the tiny model's greedy turn should run a few tokens"
    third = ids[2]
    policy = HFPolicy(_with_generation_eos(tiny_model_dir, tmp_path, extra=third), sampling=greedy)

    prompt = policy.renderer.prompt_ids([{"role": "user", "content": "say abc abc abc"}], None)
    completion = asyncio.run(policy.generate_ids(prompt, seed=3))

    assert completion.completion_ids == ids[: ids.index(third) + 1]
    assert completion.finish_reason == "stop"

"""A compiled vLLM-CPU engine with LoRA serves each request its own adapter's weights.

vLLM-CPU alone runs LoRA engines eager; agentgym's traced LoRA path (`_cpu_lora`) lets them
compile. vLLM traces the model once and keeps no guards, so a branch on the batch taken at
trace time would be kept for every later batch (an engine traced that way served the base
model under every adapter). Here the base model and two adapter versions sample in one
batch, after the trace, and each is compared with transformers + PEFT.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from agentgym.engine import HFPolicy, SamplingConfig, VLLMPolicy
from tests.conftest import require
from tests.engine.episodes import make_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def compiled(tiny_model_dir: Path) -> Any:
    require("vllm")
    with VLLMPolicy(
        tiny_model_dir, dtype="float32", max_model_len=1024, enable_lora=True, max_lora_rank=8,
        engine_kwargs={"enforce_eager": False},
    ) as policy:  # fmt: skip
        policy.start()
        yield policy


def test_the_engine_with_lora_compiles_when_asked(compiled: VLLMPolicy) -> None:
    from vllm.config import CompilationMode

    assert compiled._engine.vllm_config.compilation_config.mode != CompilationMode.NONE
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "0"  # vLLM-CPU's AOT cache never loads


async def test_base_and_two_adapters_in_one_batch_sample_what_transformers_computes(
    compiled: VLLMPolicy, tiny_model_dir: Path, tmp_path: Path
) -> None:
    adapters = {0: None}
    for seed in (3, 4):  # every linear layer: packed q/k/v and gate/up slices included
        path = make_adapter(tiny_model_dir, tmp_path / f"v{seed}", seed=seed, targets="all-linear")
        adapters[await compiled.aload_adapter(path)] = path
    prompt = compiled.renderer.prompt_ids([{"role": "user", "content": "What is 12 + 30?"}], [])
    sampling = SamplingConfig(temperature=0.7, max_tokens=16, extra={"ignore_eos": True})
    requests = []
    for version in adapters:  # each request takes the version current when it starts
        compiled.adapter_version = version
        requests.append(asyncio.ensure_future(
            compiled.generate_ids(prompt, seed=5, sampling=sampling)))  # fmt: skip
        await asyncio.sleep(0)  # one pass of the loop: submitted, still in flight with the rest
    completions = await asyncio.gather(*requests)
    assert [c.adapter_version for c in completions] == list(adapters)
    logprobs = []
    for completion, adapter in zip(completions, adapters.values()):
        oracle = HFPolicy(tiny_model_dir, adapter=adapter, dtype="float32")
        reference = oracle.token_logprobs(prompt, completion.completion_ids, temperature=0.7)
        # fp32 on both sides, different kernels: the tolerance of test_vllm_policy.py's checks
        assert completion.logprobs == pytest.approx(reference, abs=2e-3)
        logprobs.append(completion.logprobs)
    # same prompt and seed: the three agree only if some request ran another one's weights
    assert all(a != pytest.approx(b, abs=2e-3) for a, b in zip(logprobs, logprobs[1:]))
    assert logprobs[0] != pytest.approx(logprobs[2], abs=2e-3)

"""`VLLMPolicy.reload_weights`: a running engine takes a fine-tune's weights in place.

The trainer's SFT warm start relies on it (one engine for the base model's eval and the run), so
what it must prove is that nothing of the old weights is served afterwards: neither the weights
nor a prefix cached with them. Transformers on each folder is the oracle (`HFPolicy`), as for
vLLM's logprobs elsewhere. One engine serves the module.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError
from agentgym.engine import HFPolicy, VLLMPolicy
from tests.conftest import require
from tests.engine.episodes import make_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]

QUESTION = [{"role": "user", "content": "What is 12 + 30?"}]


def fine_tune(model_dir: Path, out: Path, *, scale: float = 0.05, drop: str | None = None) -> Path:
    """A copy of ``model_dir`` with every weight nudged by seeded noise (a stand-in for SFT);
    ``drop`` leaves that tensor out (a folder of another architecture)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    weights = load_file(str(model_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    nudged = {name: (t + scale * torch.randn(t.shape, generator=generator)).contiguous()
              for name, t in weights.items() if name != drop}  # fmt: skip
    save_file(nudged, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> Any:
    require("vllm")
    with VLLMPolicy(tiny_model_dir, dtype="float32", max_model_len=1024, enable_lora=True,
                    max_lora_rank=8) as p:  # fmt: skip
        yield p


async def sample(policy: VLLMPolicy, prompt: list[int]) -> Any:
    """One seeded turn at temperature 0.7 (its logprobs: the oracle's at 0.7)."""
    return await policy.with_sampling(temperature=0.7).generate_ids(prompt, max_tokens=16, seed=5)


def oracle(model: Path, prompt: list[int], completion_ids: list[int]) -> list[float]:
    return HFPolicy(model, dtype="float32").token_logprobs(prompt, completion_ids, temperature=0.7)


async def test_after_a_reload_the_engine_samples_the_new_weights_not_a_cached_prefix(
    policy: VLLMPolicy, tiny_model_dir: Path, tmp_path: Path
) -> None:
    prompt = policy.renderer.prompt_ids(QUESTION, [])
    before = await sample(policy, prompt)  # the prompt's prefix is now cached (salt of v0)
    tuned = fine_tune(tiny_model_dir, tmp_path / "tuned")
    seconds = policy.reload_weights(tuned)
    assert 0 < seconds < 60
    assert policy.model == str(tuned)  # what adapters are now checked against
    after = await sample(policy, prompt)
    # fp32 on both sides, different kernels: 2e-3 nats (as test_vllm_policy's oracle checks)
    assert after.logprobs == pytest.approx(oracle(tuned, prompt, after.completion_ids), abs=2e-3)
    base = oracle(tiny_model_dir, prompt, after.completion_ids)
    assert after.logprobs != pytest.approx(base, abs=2e-3)  # not the old weights'
    # the same request before the reload (same seed) was answered by the old weights
    assert before.logprobs == pytest.approx(
        oracle(tiny_model_dir, prompt, before.completion_ids), abs=2e-3
    )


async def test_a_misfit_folder_or_a_reload_under_an_adapter_is_refused_and_changes_nothing(
    policy: VLLMPolicy, tiny_model_dir: Path, tmp_path: Path
) -> None:
    prompt = policy.renderer.prompt_ids(QUESTION, [])
    served = await sample(policy, prompt)
    missing = fine_tune(tiny_model_dir, tmp_path / "other", drop="model.norm.weight")
    with pytest.raises(ConfigError, match=r"do not fit the served model .*model\.norm\.weight"):
        policy.reload_weights(missing)
    again = await sample(policy, prompt)  # nothing was copied
    assert (again.completion_ids, again.logprobs) == (served.completion_ids, served.logprobs)
    policy.load_adapter(make_adapter(Path(policy.model), tmp_path / "adapter", seed=1))
    with pytest.raises(ConfigError, match="reload before the first load_adapter"):
        policy.reload_weights(fine_tune(tiny_model_dir, tmp_path / "tuned"))

"""Memory estimates: parameter counts from config.json, and how a GPU's memory is shared.

There is no GPU here: `GpuSplit` is a pure function of the GPU's size, which the tests give,
and the dry run's GPU row is checked with the device and its size stood in for (said where).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError
from agentgym.trainers import GRPOConfig
from trainers._memory import GIB, GpuSplit, parameter_count

#: Public shapes of two Qwen2.5 configs (hidden, layers, heads, kv heads, MLP, vocab, tied).
QWEN_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
            "tie_word_embeddings": True}  # fmt: skip
QWEN_7B = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
           "tie_word_embeddings": False}  # fmt: skip
GPU_24G = 24 * GIB


def model_dir(tmp_path: Path, shape: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(shape))
    return tmp_path


def test_parameter_counts_match_the_published_sizes(tmp_path: Path) -> None:
    assert parameter_count(model_dir(tmp_path, QWEN_05B)) == pytest.approx(494e6, rel=0.01)
    assert parameter_count(model_dir(tmp_path, QWEN_7B)) == pytest.approx(7.61e9, rel=0.01)


def test_a_05b_model_fits_a_24_gib_gpu_beside_its_engine(tmp_path: Path) -> None:
    params = parameter_count(model_dir(tmp_path, QWEN_05B))
    split = GpuSplit.of(params, GRPOConfig(), GPU_24G)
    split.check("qwen2.5-0.5b", params)
    assert split.engine == pytest.approx(0.3 * GPU_24G)
    assert split.trainer == pytest.approx(0.7 * GPU_24G)
    assert split.describe().startswith("GPU 24.0 GiB: vLLM 7.2 GiB (weights 0.9 GiB")


@pytest.mark.parametrize(
    ("knobs", "fragment"),
    [
        ({}, "vLLM's share of the GPU (vllm_gpu_memory_utilization 0.3 of 24.0 GiB = 7.2 GiB) "
             "cannot hold the 16-bit weights of qwen2.5-7b (~7.6 B parameters), 14.2 GiB"),
        ({"vllm_gpu_memory_utilization": 0.7},
         "the trainer's share of the GPU (7.2 GiB) cannot hold its copy of the weights of "
         "qwen2.5-7b (~7.6 B parameters), 14.2 GiB; lower vllm_gpu_memory_utilization, set "
         "load_in_4bit (QLoRA)"),
        ({"rollout_engine": "hf"}, "cannot hold its copy of the weights and the 16-bit one "
                                   "rollout_engine hf samples with"),
    ],
)  # fmt: skip
def test_a_7b_model_on_24_gib_is_refused_naming_the_share_and_the_fix(
    tmp_path: Path, knobs: dict[str, Any], fragment: str
) -> None:
    params = parameter_count(model_dir(tmp_path, QWEN_7B))
    config = GRPOConfig(**knobs)
    with pytest.raises(ConfigError) as info:
        GpuSplit.of(params, config, GPU_24G).check("qwen2.5-7b", params)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_qlora_or_rollout_servers_make_room_for_the_7b_model(tmp_path: Path) -> None:
    params = parameter_count(model_dir(tmp_path, QWEN_7B))
    qlora = GpuSplit.of(params, GRPOConfig(vllm_gpu_memory_utilization=0.7, load_in_4bit=True),
                        GPU_24G)  # fmt: skip
    qlora.check("qwen2.5-7b", params)  # 4-bit: 3.9 GiB in the trainer's 7.2 GiB
    assert qlora.trainer_weights == pytest.approx(0.55 * params)
    servers = GpuSplit.of(params, GRPOConfig(rollout_servers=["http://a:8000"]), GPU_24G)
    servers.check("qwen2.5-7b", params)  # the engine is elsewhere: the whole GPU trains
    assert (servers.engine, servers.trainer) == (0.0, GPU_24G)


def test_the_dry_run_shows_the_gpu_split(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GPU here: the resolved device and the GPU's size are stood in for."""
    from trainers import _plan, _preflight

    def on_a_24_gib_gpu(config: GRPOConfig, params: int) -> GpuSplit:
        return GpuSplit.of(params, config, GPU_24G)

    for module in (_plan, _preflight):
        monkeypatch.setattr(module, "resolved_device", lambda config: "cuda")
        monkeypatch.setattr(module, "gpu_split", on_a_24_gib_gpu)
    config = GRPOConfig(env="calculator", output_dir=str(tmp_path / "run"), report_to=["none"])
    plan = dict(_plan.dry_run(config))
    assert "device auto (cuda here)" in plan["model"]
    assert "GPU 24.0 GiB: vLLM 7.2 GiB (weights 0.0 GiB" in plan["model"]

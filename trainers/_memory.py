"""Will the run fit: memory estimates read off a model's ``config.json``, before it loads.

On the CPU the trainer and the engine share this machine's memory, and the peak may be the
SFT warm start's (every weight's gradient and AdamW state) rather than GRPO's. On a GPU the
in-process vLLM engine takes ``vllm_gpu_memory_utilization`` of the device for its 16-bit
weights and KV cache, and the trainer has the rest for its own copy of the weights (4-bit
with QLoRA), the adapter, its optimiser state and the activations. Activations depend on the
episodes, so only the weights are held against each share: they are certain, and a share
that cannot hold them fails minutes later with an out-of-memory error far from its cause.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agentgym._errors import ConfigError

if TYPE_CHECKING:
    from ._config import GRPOConfig

#: Bytes per parameter of one float32 copy of the weights on the CPU: the trainer's, the
#: engine's. GRPO holds both (the adapter and its optimiser state are negligible).
BYTES_PER_PARAM_FP32 = 4
#: Bytes per parameter of a full-weight SFT warm start (``sft_method: full``) on the CPU:
#: the weights, their gradients and AdamW's two moments, 4 each.
BYTES_PER_PARAM_SFT_FULL = 16
#: Bytes per parameter of weights on a GPU: 16-bit, or 4-bit as bitsandbytes stores them
#: (half a byte, plus a constant per block of 64 and the 16-bit layers it leaves alone).
BYTES_PER_PARAM_16BIT = 2.0
BYTES_PER_PARAM_4BIT = 0.55
#: Share of vLLM's part its weights may take: the rest is KV cache and activations.
ENGINE_WEIGHTS_SHARE = 0.9
GIB = 2**30


def parameter_count(model_dir: Path) -> int:
    """Parameters of a dense decoder from its ``config.json``.

    Attention with grouped key/value heads, a gated MLP, and the embeddings, once if tied
    to the output layer: Qwen2.5-0.5B's config gives 494 M, as its weights hold.
    """
    spec = json.loads((model_dir / "config.json").read_text())
    hidden, layers = spec.get("hidden_size", 0), spec.get("num_hidden_layers", 0)
    vocab, mlp = spec.get("vocab_size", 0), spec.get("intermediate_size", 4 * hidden)
    heads = spec.get("num_attention_heads") or 1
    kv = hidden * (spec.get("num_key_value_heads") or heads) // heads
    attention = 2 * hidden * hidden + 2 * hidden * kv
    embeddings = vocab * hidden * (1 if spec.get("tie_word_embeddings") else 2)
    return int(layers * (attention + 3 * hidden * mlp) + embeddings)


def engine_beside_warm_start(config: GRPOConfig, device: str, world_size: int) -> bool:
    """Whether the run's vLLM engine stays up while its SFT warm start trains.

    It then plays the base model's eval and takes the warm start's weights in place
    (`VLLMPolicy.reload_weights`), saving an engine start: an in-process engine on the CPU,
    one process. The price is the engine's copy of the weights beside the warm start's
    optimiser state, which `CpuEstimate` counts. On a GPU the warm start gets all of it.
    """
    return (config.sft_steps > 0 and config.rollout_engine == "vllm"
            and not config.rollout_servers and device == "cpu" and world_size == 1)  # fmt: skip


@dataclass(frozen=True)
class CpuEstimate:
    """A CPU run's peak memory: the weights' bytes in its largest phase, against this machine's."""

    params: int
    need: int
    have: int
    peak: str  # the phase that needs ``need``, in words
    in_warm_start: bool = False  # the peak is a full-weight warm start's (sft_method: lora fits)

    @classmethod
    def of(cls, model_dir: Path, config: GRPOConfig, world_size: int = 1) -> CpuEstimate:
        """The estimate for ``config`` training ``model_dir`` on this machine's CPU."""
        params = parameter_count(model_dir)
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        grpo = 2 * BYTES_PER_PARAM_FP32
        sft = BYTES_PER_PARAM_SFT_FULL if config.sft_steps and config.sft_method == "full" else 0
        if sft <= grpo:
            return cls(params, params * grpo, have, "GRPO: the trainer's and the engine's weights")
        peak = "the SFT warm start: weights, gradients and AdamW state"
        if engine_beside_warm_start(config, "cpu", world_size):
            sft += BYTES_PER_PARAM_FP32
            peak += ", beside the engine's copy"
        return cls(params, params * sft, have, peak, in_warm_start=True)


@dataclass(frozen=True)
class GpuSplit:
    """How one GPU is shared: each part's bytes, and the bytes of the weights it must hold."""

    total: int
    engine: float  # the in-process vLLM engine's share (0 when it rolls out elsewhere)
    engine_weights: float
    trainer: float  # the rest: the trainer (and an `HFPolicy` copy with rollout_engine hf)
    trainer_weights: float
    trainer_holds: str = "its copy of the weights"

    @classmethod
    def of(cls, params: int, config: GRPOConfig, total: int) -> GpuSplit:
        """The split for a `GRPOConfig` on a GPU of ``total`` bytes."""
        base = params * (BYTES_PER_PARAM_4BIT if config.load_in_4bit else BYTES_PER_PARAM_16BIT)
        sixteen = params * BYTES_PER_PARAM_16BIT
        local = not config.rollout_servers
        if local and config.rollout_engine == "vllm":
            engine = config.vllm_gpu_memory_utilization * total
            return cls(total, engine, sixteen, total - engine, base)
        if not local:
            return cls(total, 0.0, 0.0, float(total), base)
        return cls(total, 0.0, 0.0, float(total), base + sixteen,  # transformers' generate
                   "its copy of the weights and the 16-bit one rollout_engine hf samples with")

    def describe(self) -> str:
        """One line for the dry-run's plan."""
        text = f"GPU {self.total / GIB:.1f} GiB: "
        if self.engine:
            text += (f"vLLM {self.engine / GIB:.1f} GiB (weights {self.engine_weights / GIB:.1f} "
                     "GiB, the rest KV cache), ")  # fmt: skip
        return text + (f"trainer {self.trainer / GIB:.1f} GiB (weights "
                       f"{self.trainer_weights / GIB:.1f} GiB, then the adapter, its optimiser "
                       "state and activations)")

    def check(self, model_name: str, params: int) -> None:
        """Refuse a split in which a part's share cannot hold its weights.

        Raises:
            ConfigError: naming the share, the weights and the knobs that move them.
        """
        size = f"{model_name} (~{params / 1e9:.1f} B parameters)"
        if self.engine and self.engine_weights > ENGINE_WEIGHTS_SHARE * self.engine:
            raise ConfigError(
                f"vLLM's share of the GPU (vllm_gpu_memory_utilization "
                f"{self.engine / self.total:g} of "
                f"{self.total / GIB:.1f} GiB = {self.engine / GIB:.1f} GiB) cannot hold the "
                f"16-bit weights of {size}, {self.engine_weights / GIB:.1f} GiB, and a KV "
                "cache; raise vllm_gpu_memory_utilization, or roll out on other GPUs "
                "(rollout_servers)"
            )
        if self.trainer_weights > self.trainer:
            fixes = "lower vllm_gpu_memory_utilization, " if self.engine else ""
            raise ConfigError(
                f"the trainer's share of the GPU ({self.trainer / GIB:.1f} GiB) cannot hold "
                f"{self.trainer_holds} of {size}, {self.trainer_weights / GIB:.1f} GiB; "
                f"{fixes}set load_in_4bit (QLoRA), or use a smaller model"
            )

"""GRPO + LoRA trainer on vLLM rollouts: `GRPOTrainer`, `GRPOConfig`, and the pieces it uses.

`agentgym train CONFIG.yaml` runs it from the command line. The loss, advantage and sample
functions are exported too: they are small, pure and tested on tiny tensors, so they can be
reused in another loop. torch, peft and vLLM load only when a trainer runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._advantages import Advantages, group_advantages, trajectory_advantages
from ._config import GRPOConfig
from ._samples import Batch, Sample, build_samples, collate

if TYPE_CHECKING:
    from ._export import export_run
    from ._grpo import GRPOTrainer, StaleAdapterError
    from ._loss import LossSpec, grpo_loss, token_logprobs
    from ._sft import SFTConfig, sft_warm_start

_LAZY = {
    "GRPOTrainer": "._grpo",
    "StaleAdapterError": "._grpo",
    "export_run": "._export",
    "LossSpec": "._loss",
    "grpo_loss": "._loss",
    "token_logprobs": "._loss",
    "SFTConfig": "._sft",
    "sft_warm_start": "._sft",
}


def __getattr__(name: str) -> Any:
    """Import the torch-backed parts on first use, so `GRPOConfig` stays cheap to import."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    from agentgym._extras import needs_extra

    with needs_extra(f"agentgym.trainers.{name}", "train"):
        module = importlib.import_module(_LAZY[name], __name__)
    return getattr(module, name)


__all__ = [
    "Advantages",
    "Batch",
    "GRPOConfig",
    "GRPOTrainer",
    "LossSpec",
    "SFTConfig",
    "Sample",
    "StaleAdapterError",
    "build_samples",
    "collate",
    "export_run",
    "grpo_loss",
    "group_advantages",
    "sft_warm_start",
    "token_logprobs",
    "trajectory_advantages",
]

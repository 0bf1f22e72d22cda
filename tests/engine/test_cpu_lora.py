"""agentgym's CPU LoRA fast path does vLLM's arithmetic, and vLLM loads it only when asked.

The end-to-end check (an engine sampling what transformers + PEFT compute with an adapter on
every linear layer) is in test_vllm_policy.py, which shares its engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from agentgym.engine import _cpu_lora
from tests.conftest import require

pytestmark = pytest.mark.vllm


def stacked(torch: Any, max_loras: int, rank: int, inputs: int, slices: list[int]) -> tuple:
    """Random weights stacked as vLLM does: A (loras, 1, rank, in), B (loras, 1, out, rank)."""
    a = tuple(torch.randn(max_loras, 1, rank, inputs) for _ in slices)
    b = tuple(torch.randn(max_loras, 1, out, rank) for out in slices)
    return a, b


def vllms_result(torch: Any, y: Any, x: Any, a: tuple, b: tuple, scale: float, slot: int) -> Any:
    """What vLLM's own CPU ops add to ``y`` (a float32 buffer per slice, then the expand)."""
    ops = require("vllm.lora.ops.torch_ops.lora_ops")
    out = y.clone()
    indices = torch.full((x.shape[0],), slot, dtype=torch.long)
    offset = 0
    for a_i, b_i in zip(a, b):
        size = b_i.shape[2]
        buffer = torch.zeros(x.shape[0], a_i.shape[2], dtype=torch.float32)
        ops.bgmv_shrink(x, a_i, buffer, indices, scale)
        ops.bgmv_expand_slice(buffer, b_i, out, indices, offset, size, add_inputs=True)
        offset += size
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_path_equals_vllms_ops_for_packed_slices(dtype: str) -> None:
    torch = require("torch")
    torch.manual_seed(0)
    kind = getattr(torch, dtype)
    slices, tokens, inputs, slot, scale = [24, 8, 8], 5, 16, 1, 0.5  # q, k, v packed
    a, b = stacked(torch, 3, 4, inputs, slices)
    b = tuple(w.to(kind) for w in b)
    x = torch.randn(tokens, inputs).to(kind)
    y = torch.randn(tokens, sum(slices)).to(kind)
    expected, ours = vllms_result(torch, y, x, a, b, scale, slot), y.clone()
    _cpu_lora.single_adapter_linear(ours, x, a, b, scale, slices, slot)
    tolerance = 1e-5 if dtype == "float32" else 3e-2  # bf16: a different summation order
    assert torch.allclose(ours.float(), expected.float(), atol=tolerance, rtol=tolerance)
    assert not torch.allclose(ours.float(), y.float(), atol=tolerance)  # it added something


def test_new_weights_written_into_a_slot_are_used_at_once() -> None:
    """The fused weights are cached per layer; vLLM loads the next adapter version into a slot
    in place, and the next call must compute with it, not with the cached copy."""
    torch = require("torch")
    torch.manual_seed(0)
    slices, slot, scale = [24, 8, 8], 1, 0.5
    a, b = stacked(torch, 2, 4, 16, slices)
    x, y = torch.randn(3, 16), torch.zeros(3, sum(slices))
    first = y.clone()
    assert _cpu_lora.single_adapter_linear(first, x, a, b, scale, slices, slot)
    for a_i, b_i in zip(a, b):  # what vLLM's set_lora does for the next version
        a_i[slot, 0].copy_(torch.randn_like(a_i[slot, 0]))
        b_i[slot, 0].copy_(torch.randn_like(b_i[slot, 0]))
    second = y.clone()
    assert _cpu_lora.single_adapter_linear(second, x, a, b, scale, slices, slot)
    assert torch.allclose(second, vllms_result(torch, y, x, a, b, scale, slot), atol=1e-5)
    assert not torch.allclose(second, first, atol=1e-3)


def test_tensors_without_version_counters_keep_vllms_path() -> None:
    """Inference-mode tensors have no version counter, so a cache could not see a new
    version: the fast path declines and leaves the output to vLLM's path."""
    torch = require("torch")
    with torch.inference_mode():
        a, b = stacked(torch, 2, 4, 16, [8])
        x, y = torch.randn(3, 16), torch.zeros(3, 8)
        assert not _cpu_lora.single_adapter_linear(y, x, a, b, 0.5, [8], 0)
        assert not y.any()


def test_only_batches_of_one_adapter_take_the_fast_path() -> None:
    torch = require("torch")

    def slot(*indices: int) -> int | None:
        return _cpu_lora.batch_slot(torch.tensor(indices, dtype=torch.long))

    assert slot(2, 2, 2) == 2 and slot(0) == 0
    assert slot(1, 2) is None  # two adapter versions in one batch (a sync mid-rollout)
    assert slot(-1, 1) is None  # the base model beside an adapter
    assert slot(-1, -1) is None and slot() is None  # no adapter: nothing to add


#: A batch mixing the base model (-1) and two adapter slots, as a compiled engine meets it.
MIXED_SLOTS = [1, -1, 0, 1, -1, 0]


def per_token_reference(torch: Any, y: Any, x: Any, a: tuple, b: tuple, scale: float) -> Any:
    """vLLM's ops one token at a time with that token's slot; base tokens stay as they are."""
    rows = [
        vllms_result(torch, y[t : t + 1], x[t : t + 1], a, b, scale, s) if s >= 0 else y[t : t + 1]
        for t, s in enumerate(MIXED_SLOTS)
    ]  # fmt: skip
    return torch.cat(rows)


def test_traced_path_gives_each_token_its_own_adapter_and_base_tokens_none() -> None:
    torch = require("torch")
    torch.manual_seed(0)
    slices, inputs, scale = [24, 8, 8], 16, 0.5  # q, k, v packed
    a, b = stacked(torch, 2, 4, inputs, slices)
    x, y = torch.randn(len(MIXED_SLOTS), inputs), torch.randn(len(MIXED_SLOTS), sum(slices))
    slots = torch.tensor([*MIXED_SLOTS, 1, 1], dtype=torch.long)  # vLLM's buffer runs longer
    ours = y.clone()
    _cpu_lora.traced_lora_linear(ours, x, a, b, scale, slices, slots)
    assert torch.allclose(ours, per_token_reference(torch, y, x, a, b, scale), atol=1e-5)
    assert not torch.allclose(ours[0], y[0], atol=1e-3)  # it added something


def test_traced_path_holds_in_one_graph_for_batches_it_was_not_traced_on() -> None:
    """Traced on a batch of one adapter, then run on a mixed one: nothing was kept from the
    first (vLLM drops a graph's guards, so a kept branch would go unnoticed there)."""
    torch = require("torch")
    torch.manual_seed(0)
    slices, inputs, scale = [16, 16], 16, 0.5  # gate, up packed
    a, b = stacked(torch, 2, 4, inputs, slices)
    graph = torch.compile(_cpu_lora.traced_lora_linear, backend="aot_eager", fullgraph=True)
    x, y = torch.randn(len(MIXED_SLOTS), inputs), torch.randn(len(MIXED_SLOTS), sum(slices))
    graph(y.clone(), x, a, b, scale, slices, torch.zeros(len(MIXED_SLOTS), dtype=torch.long))
    ours = y.clone()
    graph(ours, x, a, b, scale, slices, torch.tensor(MIXED_SLOTS, dtype=torch.long))
    assert torch.allclose(ours, per_token_reference(torch, y, x, a, b, scale), atol=1e-5)


def test_traced_embedding_path_adds_each_tokens_adapter_rows() -> None:
    torch = require("torch")
    ops = require("vllm.lora.ops.torch_ops.lora_ops")
    torch.manual_seed(0)
    lora_b = torch.randn(2, 1, 12, 4)  # (slots, 1, embedding width, rank), as vLLM keeps it
    x, y = torch.randn(len(MIXED_SLOTS), 4), torch.randn(len(MIXED_SLOTS), 12)
    ours = y.clone()
    _cpu_lora.traced_lora_embedding(ours, x, lora_b, torch.tensor(MIXED_SLOTS))
    expected = y.clone()
    for t, s in enumerate(MIXED_SLOTS):
        if s >= 0:  # vLLM's op indexes -1 as the last slot; agentgym's adds nothing there
            ops.bgmv_expand(x[t : t + 1], lora_b, expected[t : t + 1], torch.tensor([s]))
    assert torch.allclose(ours, expected, atol=1e-5)
    assert not torch.allclose(ours[0], y[0], atol=1e-3)


def test_a_layer_the_traced_path_does_not_cover_names_the_fix() -> None:
    torch = require("torch")
    a, b = stacked(torch, 2, 4, 16, [8])
    with pytest.raises(NotImplementedError, match="enforce_eager=True"):
        _cpu_lora.traced_lora_linear(torch.zeros(3, 12), torch.randn(3, 16), a, b, 1.0, [8],
                                     torch.zeros(3, dtype=torch.long))  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("switch", ["1", "0", None])
def test_vllm_loads_the_fast_path_only_where_the_environment_asks(switch: str | None) -> None:
    require("vllm")
    env = {k: v for k, v in os.environ.items() if k != _cpu_lora.ENV_VAR}
    if switch is not None:
        env[_cpu_lora.ENV_VAR] = switch
    probe = (
        "from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU as W; "
        "print(getattr(W, '_agentgym_fast_path', False))"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=300, check=True)  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == str(switch == "1")

"""Decode speed on the vLLM CPU build with a LoRA adapter: vLLM's own path vs agentgym's.

Two engines on the same model run side by side in one process, one started with
``AGENTGYM_CPU_LORA_FAST_PATH=0`` (vLLM's multi-adapter torch ops) and one with ``=1``
(`agentgym.engine._cpu_lora`: two matrix products per layer when one adapter serves the
batch). Trials alternate between them, so machine noise hits both alike. Each trial samples
``--sequences`` calculator prompts x ``--tokens`` tokens (``ignore_eos``), with no adapter
(the base model) and then with the same rank-16 adapter on every linear layer (as the
trainer's LoRA). Printed: ms per generated token, i.e. the batch's wall time over
``--tokens`` (median trial; the prefill of the prompts and scheduling are included, so it
is not a pure decode step), and the ratios: each path's adapter time over its own engine's
base-model time, and vLLM's adapter time over agentgym's.

    python bench/cpu_lora_bench.py [--shape quickstart|tiny] [--trials 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from agentgym.engine import SamplingConfig, VLLMPolicy, _cpu_lora
from agentgym.engine.tiny import PRESETS, build_tiny_model, save_random_adapter
from agentgym.envs.calculator import CalculatorEnv

SHAPES = {"tiny": {}, "quickstart": PRESETS["quickstart"]}


def engine(model_dir: Path, tokens: int, fast: bool) -> VLLMPolicy:
    """An engine started with the fast path switched on or off (its processes read the env)."""
    os.environ[_cpu_lora.ENV_VAR] = "1" if fast else "0"
    policy = VLLMPolicy(
        model_dir, dtype="float32", max_model_len=1024, enable_lora=True, max_lora_rank=16,
        sampling=SamplingConfig(temperature=1.0, max_tokens=tokens, extra={"ignore_eos": True}),
    )  # fmt: skip
    policy.start()
    return policy


def seconds(policy: VLLMPolicy, prompts: list[list[int]]) -> float:
    async def batch() -> None:
        await asyncio.gather(*(policy.generate_ids(ids) for ids in prompts))

    started = time.perf_counter()
    asyncio.run(batch())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="quickstart", choices=sorted(SHAPES))
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    model_dir = build_tiny_model(**SHAPES[args.shape])
    env = CalculatorEnv(num_tasks=64)
    engines: dict[str, VLLMPolicy] = {}
    try:
        engines["vLLM's path"] = engine(model_dir, args.tokens, False)
        engines["agentgym's path"] = engine(model_dir, args.tokens, True)
        any_engine = next(iter(engines.values()))
        prompts = []
        for i in range(args.sequences):
            messages, _ = env.reset(options={"task": i})
            prompts.append(any_engine.renderer.prompt_ids(messages, env.tool_schemas))
        times: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            adapter = save_random_adapter(model_dir, Path(tmp) / "adapter", rank=16, alpha=32)
            for phase in ("base model", "adapter"):
                if phase == "adapter":
                    for policy in engines.values():
                        policy.load_adapter(adapter)
                for policy in engines.values():
                    seconds(policy, prompts)  # warm-up, off the clock
                for _ in range(args.trials):
                    for name, policy in engines.items():
                        times.setdefault(f"{phase}, {name}", []).append(seconds(policy, prompts))
    finally:
        for policy in engines.values():
            policy.close()
    step_ms = {k: statistics.median(v) / args.tokens * 1000 for k, v in times.items()}
    print(f"\n{args.shape} model, {args.sequences} sequences x {args.tokens} tokens, "
          f"median of {args.trials} alternating trials: ms per generated token "
          f"(batch wall time / tokens, prefill and scheduling included)")  # fmt: skip
    for key, value in step_ms.items():
        print(f"  {key:<34} {value:6.2f}")
    slow, fast = step_ms["adapter, vLLM's path"], step_ms["adapter, agentgym's path"]
    slow_base = step_ms["base model, vLLM's path"]
    fast_base = step_ms["base model, agentgym's path"]
    print(f"  with an adapter: agentgym's path {slow / fast:.2f}x faster than vLLM's; "
          f"an adapter token costs {fast / fast_base:.2f}x a base-model token on agentgym's "
          f"path, {slow / slow_base:.2f}x on vLLM's (each over its own engine's base "
          f"model)")  # fmt: skip

if __name__ == "__main__":
    main()

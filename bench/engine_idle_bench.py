"""What vLLM's busy-waiting costs the work that follows a generate, with and without `idle()`.

One engine on the tiny model; each trial generates one turn, then times a fixed torch workload
(float32 matmuls, as an optimiser step does) in this process: right after the generate with the
engine left alone (vLLM's processes spin for work for a second), right after with
`VLLMPolicy.idle()` (they sleep at once), and two seconds after (the spin is over: the floor).
Trials alternate, medians are printed. ::

    python bench/engine_idle_bench.py [--trials 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch

from agentgym.engine import VLLMPolicy
from agentgym.engine.tiny import build_tiny_model


def torch_work() -> float:
    """Seconds of 200 512x512 float32 matmuls."""
    a = torch.randn(512, 512)
    started = time.perf_counter()
    for _ in range(200):
        a @ a
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"left alone": [], "idle()": [], "2 s later": []}
    with VLLMPolicy(build_tiny_model(), sampling={"max_tokens": 48}, dtype="float32",
                    max_model_len=1024, enable_lora=True, max_lora_rank=16) as policy:  # fmt: skip
        prompt = policy.tokenizer.encode("What is 12 + 30?")
        torch_work()  # warm-up
        for _ in range(args.trials):
            for case in times:
                asyncio.run(policy.generate_ids(prompt))
                if case == "idle()":
                    policy.idle()
                elif case == "2 s later":
                    time.sleep(2.0)
                times[case].append(torch_work())
    medians = {case: statistics.median(values) for case, values in times.items()}
    print(f"torch work right after a generate, median of {args.trials} alternating trials:")
    for case, value in medians.items():
        print(f"  {case:<11} {value * 1000:7.1f} ms")
    print(f"idle() makes it {medians['left alone'] / medians['idle()']:.2f}x faster; "
          f"{medians['idle()'] / medians['2 s later']:.2f}x the floor")  # fmt: skip


if __name__ == "__main__":
    main()

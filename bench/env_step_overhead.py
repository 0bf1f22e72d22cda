"""Env step overhead without LLM or tool time: parse + validate + dispatch + bookkeeping.

A ToolEnv with one no-op async tool; each episode is reset, one tool-call turn (hermes text,
parsed and validated), one final-answer turn (scored by a one-function rubric). Pinned to one
core. Prints microseconds per step and steps per second for the async path (what the rollout
engine uses) and for the sync Gymnasium adapter, side by side in one run: both warmed up
first, their repeats interleaved, each env built and closed outside its timer.

    python bench/env_step_overhead.py [--episodes 5000]

`env_peers_bench.py` times the same kind of episode side by side with GEM, skyrl-gym and
verifiers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import agentgym

CALL = '<tool_call>\n{"name": "noop", "arguments": {"x": 1}}\n</tool_call>'
FINAL = "The answer is 42."


@agentgym.tool
async def noop(x: int) -> str:
    """Do nothing (its time is not the env's overhead).

    Args:
        x: any integer.
    """
    return "ok"


def make_env() -> agentgym.ToolEnv:
    return agentgym.ToolEnv(
        [noop],
        tasks=[{"prompt": "What is 6 * 7?", "answer": "42"}],
        rubric=agentgym.Rubric([lambda completion, answer: float(answer in completion)]),
    )


async def async_steps(episodes: int) -> float:
    """Seconds per step on the async path; the env is built and closed outside the timer."""
    env = make_env()
    try:
        start = time.perf_counter()
        for i in range(episodes):
            await env.areset(seed=i)
            await env.astep(CALL)
            await env.astep(FINAL)
        return (time.perf_counter() - start) / (2 * episodes)
    finally:
        await env.aclose()


def sync_steps(episodes: int) -> float:
    """Seconds per step on the sync adapter; built and closed outside the timer, as above."""
    env = make_env()
    try:
        start = time.perf_counter()
        for i in range(episodes):
            env.reset(seed=i)
            env.step(CALL)
            env.step(FINAL)
        return (time.perf_counter() - start) / (2 * episodes)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    asyncio.run(async_steps(200))  # warm caches and imports, both paths alike
    sync_steps(200)
    results: dict[str, list[float]] = {"async (astep)": [], "sync (step)": []}
    for _ in range(args.repeats):  # interleaved, so both see the same machine noise
        results["async (astep)"].append(asyncio.run(async_steps(args.episodes)))
        results["sync (step)"].append(sync_steps(args.episodes))
    print(f"env step overhead, {2 * args.episodes} steps x {args.repeats} repeats, one core")
    print("(one step = parse + schema validation + tool dispatch + bookkeeping; reset and")
    print(" the final rubric included, reported per step; no LLM, no tool time)")
    for name, per_step in results.items():
        median = statistics.median(per_step)
        print(f"  {name:14s} {median * 1e3:.4f} ms/step  {1 / median:,.0f} steps/s")
    goal = statistics.median(results["async (astep)"])
    print(f"goal < 0.2 ms/step and > 5,000 steps/s: {'met' if goal < 2e-4 else 'NOT met'}")


if __name__ == "__main__":
    main()

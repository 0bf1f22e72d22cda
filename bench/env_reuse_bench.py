"""Rollout wall time with envs reused across episodes vs a new env for every episode.

`arollout` makes one env per concurrent slot and ``reset``s it for each episode; before, it
made (and closed) one env per episode, which is what `run_episode` alone still does. Both are
timed here side by side, in interleaved rounds (both warmed up first, their order alternating
round by round), on built-in envs whose construction costs
something: the quickstart's calculator (2,200 generated tasks) and ToolAPI-v0 (12 OpenAPI
tools over a shop service that its live envs share). The policy is each env's own reference
script (`ScriptedPolicy` of ``reference_turns``), so no model time hides the env's: what is
left is env construction, reset, tool calls and scoring. Every episode must score 1.0, or
the bench stops.

    python bench/env_reuse_bench.py [--episodes 64] [--concurrency 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import agentgym
from agentgym import EpisodeSpec, ScriptedPolicy, Trajectory, arollout, make, run_episode

#: (label, env id, env kwargs): the envs timed.
ENVS: list[tuple[str, str, dict[str, Any]]] = [
    ("calculator, 2,200 tasks (the quickstart's)", "calculator", {"num_tasks": 2200}),
    ("ToolAPI-v0 (12 OpenAPI tools, a shared service)", "agentgym/ToolAPI-v0", {}),
]


def script(env_id: str, kwargs: dict[str, Any]) -> ScriptedPolicy:
    """The env's reference script as a policy, its env closed again before any timing.

    Closed, so that no live env of the policy's keeps a shared service (ToolAPI-v0's shop)
    up through the timed runs: a new env per episode then pays for what it really costs.
    """
    env = make(env_id, **kwargs)
    try:
        return ScriptedPolicy(env.reference_turns)
    finally:
        env.close()


async def reused(
    policy: ScriptedPolicy, env_id: str, kwargs: dict[str, Any], tasks: list[int], slots: int
) -> list[Any]:
    """`arollout`: an env per slot, reset for each of its episodes."""
    return await arollout(env_id, policy, tasks=tasks, env_kwargs=kwargs, max_concurrency=slots)


async def fresh(
    policy: ScriptedPolicy, env_id: str, kwargs: dict[str, Any], tasks: list[int], slots: int
) -> list[Any]:
    """The same episodes with a new env each (`run_episode`), ``slots`` at a time."""
    limit = asyncio.Semaphore(slots)

    async def one(position: int, task: int) -> Trajectory:
        async with limit:
            spec = EpisodeSpec(task, task, 0, seed=position, task_position=position)
            return await run_episode(lambda: make(env_id, **kwargs), policy, spec, env_id=env_id)

    return list(await asyncio.gather(*(one(p, t) for p, t in enumerate(tasks))))


def timed(play: Any, *args: Any) -> float:
    """Wall seconds of one ``play``; the policy's script is built before the timer starts."""
    policy = script(args[0], args[1])
    started = time.perf_counter()
    trajectories = asyncio.run(play(policy, *args))
    seconds = time.perf_counter() - started
    rewards = {t.final_reward for t in trajectories}
    if rewards != {1.0}:
        raise RuntimeError(f"{play.__name__} on {args[0]}: rewards {rewards}, not all 1.0")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    assert agentgym.envs  # the built-in envs are registered
    print(f"{args.episodes} episodes, {args.concurrency} at a time, reference policy; "
          f"median of {args.rounds} interleaved rounds")  # fmt: skip
    for label, env_id, kwargs in ENVS:
        env = make(env_id, **kwargs)
        count = len(env.tasks)
        env.close()  # ToolAPI's shop would stay up through every timed round
        run = (env_id, kwargs, [i % count for i in range(args.episodes)], args.concurrency)
        timed(fresh, *run)  # warm-up of both sides: imports, caches
        timed(reused, *run)
        plays = {"fresh": fresh, "reused": reused}
        times: dict[str, list[float]] = {name: [] for name in plays}
        for round_ in range(args.rounds):  # the order alternates round by round
            for name in sorted(plays, reverse=round_ % 2 == 1):
                times[name].append(timed(plays[name], *run))
        new, reuse = (statistics.median(times[k]) for k in ("fresh", "reused"))
        verdict = f"{new / reuse:5.2f}x faster" if new >= reuse else f"{reuse / new:5.2f}x slower"
        print(f"  {label:45s} new env per episode {new:6.2f} s   reused {reuse:6.2f} s   "
              f"-> reused {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()

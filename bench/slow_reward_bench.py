"""Rollout wall time with a reward function that waits: on the event loop vs on threads.

A judge called through a blocking HTTP client holds whatever thread calls it. A sync reward
function runs on the event loop, so every other episode waits while it does; named in
``Rubric(threaded=...)`` it runs on a worker thread and the episodes' judges wait side by
side. Both are timed here in interleaved rounds on the calculator env, its own reference
turns as the policy (no model time hides the reward's), its reward a judge that blocks for
``--judge-seconds`` (``time.sleep``: what a blocking call does to the thread), then pays the
right answer as the env's own reward does. Every episode must score 1.0, or the bench stops.

    python bench/slow_reward_bench.py [--episodes 32] [--judge-seconds 0.1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from agentgym import Rubric, ScriptedPolicy, make, rollout
from agentgym.envs.calculator import CalculatorEnv, correct_answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--judge-seconds", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    def judge(completion: str, answer: str) -> float:
        time.sleep(args.judge_seconds)  # a blocking call: the thread waits, as on `requests`
        return correct_answer(completion, answer)

    def env_with(threaded: bool) -> Any:
        def judged() -> CalculatorEnv:
            env = CalculatorEnv(num_tasks=args.episodes)
            env.rubric = Rubric([judge], threaded=threaded)
            return env

        return judged

    policy = ScriptedPolicy(make("calculator", num_tasks=args.episodes).reference_turns)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for threaded in (False, True):
            started = time.perf_counter()
            played = rollout(env_with(threaded), policy, num_tasks=args.episodes,
                             max_concurrency=args.episodes)  # fmt: skip
            times[threaded].append(time.perf_counter() - started)
            if any(t.total_reward != 1.0 for t in played):
                raise SystemExit("an episode did not score 1.0: the bench timed the wrong thing")
    on_loop, on_threads = (statistics.median(times[k]) for k in (False, True))
    print(f"{args.episodes} episodes, a judge that blocks {args.judge_seconds:g} s, "
          f"median of {args.rounds} rounds")  # fmt: skip
    print(f"  on the event loop   {on_loop:.3f} s  (rounds {_rounds(times[False])})")
    print(f"  threaded=True       {on_threads:.3f} s  (rounds {_rounds(times[True])})")
    print(f"  ratio               {on_loop / on_threads:.1f}x")


def _rounds(values: list[float]) -> str:
    return " / ".join(f"{v:.3f}" for v in values)


if __name__ == "__main__":
    main()

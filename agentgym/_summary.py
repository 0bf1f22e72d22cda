"""Aggregate figures over a batch of trajectories (what `agentgym eval` prints and saves)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable
from statistics import fmean, pstdev, stdev
from typing import Any

from ._trajectory import STATUSES, Trajectory

#: The statuses of episodes scored as the policy's (as the trainer keeps them in its groups).
POLICY_STATUSES = ("ok", "truncated", "error")
#: The share of repeated tasks whose episodes all scored alike, named as the trainer logs it.
ONE_REWARD_KEY = "reward/frac_zero_variance_groups"


def summarize(
    trajectories: Iterable[Trajectory],
    wall_seconds: float | None = None,
    played: int | None = None,
) -> dict[str, Any]:
    """Counts by status, reward statistics over scored episodes, per-rubric means, turn/tool stats.

    ``wall_seconds`` is how long ``played`` of the episodes took (all of them by default; fewer
    when a resumed run only played the missing ones), for the episodes-per-second figure.

    Rewards are averaged over the policy's episodes (``ok``, ``truncated`` and ``error``, with
    the reward an ``error`` episode got, 0 where none was computed), as the trainer's are:
    an ``error`` is an exception in the env, a reward function or the policy, and left out
    it would raise the mean of a policy whose answers make scoring crash (the eval names
    their count). ``infra_error`` and ``late`` episodes (the server, a sandbox or the clock
    failed) say nothing about the policy and are counted apart. ``episodes/forfeit`` counts
    the scored episodes a call ended with reward 0 (`Forfeit`); ``tools/results_cut`` the tool
    results the env cut to its ``max_tool_result_chars`` (the model read their start only).
    ``reward/stderr`` is the mean's standard error, so two evals can be told apart from
    noise; with several episodes per task it is taken over the tasks' means (episodes of one
    task are not independent draws, and counting them as such would understate it).
    ``pass@k`` (`pass_at_k`, over the tasks with at least k scored episodes): the chance that
    one of k episodes of a task reaches reward 1.0; ``pass@1`` with one episode per task, and
    more k with ``group_size`` > 1, and then ``reward/frac_zero_variance_groups`` (the tasks
    whose episodes all scored alike: no GRPO signal). ``tokens/completions_total`` counts every
    token the policy sampled (what an eval cost, failed episodes included): a turn's token ids
    where the backend returned them, else the count the server reported in its ``usage``
    (``Turn.completion_tokens``: an OpenAI server other than vLLM); None, as
    ``tokens/per_episode``, where the backend reported neither;
    ``tokens/per_episode`` and ``turns/mean`` are means over the policy's episodes too, as the
    trainer's per-episode figures are: an ``infra_error`` or ``late`` episode cut at turn 0 says
    nothing about how long the policy's episodes run, and averaged in it made a run whose server
    failed half the time read as one of episodes half as long. ``status`` lists every status in
    one order.
    """
    trajectories = list(trajectories)  # e.g. read_jsonl's generator
    scored = [t for t in trajectories if t.status in POLICY_STATUSES]
    rewards = [t.total_reward for t in scored]
    score_names = sorted({name for t in scored for name in t.scores})
    turns = [len(t.turns) for t in scored]
    tool_errors = sum(len(turn.tool_errors) for t in trajectories for turn in t.turns)
    results_cut = sum(turn.tool_results_cut for t in trajectories for turn in t.turns)
    # None where the backend reported no token count: 0 read as an eval that sampled nothing
    counted = any(turn.sampled_tokens is not None for t in trajectories for turn in t.turns)
    tokens = sum(_sampled(t) for t in trajectories) if counted else None
    by_task = list(_by_task(scored).values())
    summary: dict[str, Any] = {
        "episodes": len(trajectories),
        "status": _status_counts(trajectories),
        "reward/mean": fmean(rewards) if rewards else None,
        "reward/std": pstdev(rewards) if rewards else None,
        "reward/stderr": _stderr(by_task),
        **_pass_at(by_task),
        **_one_reward_groups(by_task),
        "turns/mean": fmean(turns) if turns else None,
        "tools/errors": tool_errors,
        "tools/results_cut": results_cut,
        "episodes/forfeit": sum("forfeit" in t.info for t in trajectories),
        "tokens/completions_total": tokens,
        "tokens/per_episode": fmean(map(_sampled, scored)) if scored and counted else None,
    }
    for name in score_names:
        values = [v for t in scored if (v := t.scores.get(name)) is not None]
        summary[f"scores/{name}"] = fmean(values) if values else None
    if wall_seconds is not None:
        summary["time/wall_seconds"] = wall_seconds
        count = len(trajectories) if played is None else played
        summary["time/episodes_per_second"] = count / wall_seconds if wall_seconds else None
    return summary


def _sampled(trajectory: Trajectory) -> int:
    """Tokens the policy sampled in one episode (0 where the backend reported no count)."""
    return sum(turn.sampled_tokens or 0 for turn in trajectory.turns)


def _status_counts(trajectories: list[Trajectory]) -> dict[str, int]:
    """Episodes per status, every status listed in `STATUSES` order (zeros included).

    Why: in the order first met, two runs' ``summary.json`` listed them differently (a run
    whose first episode failed began with ``infra_error``), which reads as a change in a diff.
    """
    counts: Counter[str] = Counter(t.status for t in trajectories)
    return {status: counts[status] for status in (*STATUSES, *sorted(counts.keys() - {*STATUSES}))}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of k episodes drawn from n passes, when c of the n did.

    The unbiased estimator of Chen et al. (2021, HumanEval): ``1 - C(n-c, k) / C(n, k)``;
    playing more episodes than k and estimating beats playing exactly k (lower variance).
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _by_task(scored: list[Trajectory]) -> dict[Hashable, list[float]]:
    """Each task's rewards (a task listed twice is two tasks, as in the rollout's plan)."""
    groups: dict[Hashable, list[float]] = defaultdict(list)
    for t in scored:
        key = t.task_position if t.task_position is not None else t.task_index
        groups[key if key is not None else repr(t.task)].append(t.total_reward)
    return groups


def one_reward_share(trajectories: Iterable[Trajectory]) -> float | None:
    """`summarize`'s ``reward/frac_zero_variance_groups`` alone (None without a repeated task).

    For the health rules, which need this one figure and not the whole summary.
    """
    scored = [t for t in trajectories if t.status in POLICY_STATUSES]
    return _one_reward_groups(list(_by_task(scored).values())).get(ONE_REWARD_KEY)


def _one_reward_groups(by_task: list[list[float]]) -> dict[str, float]:
    """With several episodes a task: the share of tasks whose episodes all scored alike.

    Why: GRPO learns from the differences within a group; an eval with ``--group-size`` G of
    the model a run would start from says, before the run, how many of its groups would
    carry no signal (the trainer's ``reward/frac_zero_variance_groups``, read the same way).
    """
    groups = [rewards for rewards in by_task if len(rewards) > 1]
    if not groups:
        return {}
    flat = sum(max(rewards) - min(rewards) <= 1e-12 for rewards in groups)
    return {ONE_REWARD_KEY: flat / len(groups)}


def _stderr(by_task: list[list[float]]) -> float | None:
    """The reward mean's standard error: over episodes, or over task means when tasks repeat."""
    repeated = any(len(rewards) > 1 for rewards in by_task)
    values = [fmean(r) for r in by_task] if repeated else [r for rs in by_task for r in rs]
    return stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def _pass_at(by_task: list[list[float]]) -> dict[str, float]:
    """``pass@k`` for k = 1, 2, 4 ... and the largest group, each over the tasks it fits."""
    passed = [[r >= 1.0 for r in rewards] for rewards in by_task]
    largest = max(map(len, passed), default=0)
    if not largest:
        return {}
    ks = sorted({1 << i for i in range(largest.bit_length())} | {largest})
    return {
        f"pass@{k}": fmean(pass_at_k(len(g), sum(g), k) for g in passed if len(g) >= k)
        for k in ks
    }

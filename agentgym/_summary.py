"""Aggregate figures over a batch of trajectories (what `agentgym eval` prints and saves)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from statistics import fmean, pstdev
from typing import Any

from ._trajectory import STATUSES, Trajectory


def summarize(
    trajectories: Iterable[Trajectory],
    wall_seconds: float | None = None,
    played: int | None = None,
) -> dict[str, Any]:
    """Counts by status, reward statistics over scored episodes, per-rubric means, turn/tool stats.

    ``wall_seconds`` is how long ``played`` of the episodes took (all of them by default; fewer
    when a resumed run only played the missing ones), for the episodes-per-second figure.

    Rewards are averaged over episodes that produced one (``ok`` and ``truncated``):
    ``error``/``infra_error`` episodes say nothing about the policy and are counted apart.
    """
    trajectories = list(trajectories)  # e.g. read_jsonl's generator
    scored = [t for t in trajectories if t.status in ("ok", "truncated")]
    rewards = [t.total_reward for t in scored]
    score_names = sorted({name for t in scored for name in t.scores})
    turns = [len(t.turns) for t in trajectories]
    tool_errors = sum(len(turn.tool_errors) for t in trajectories for turn in t.turns)
    tokens = sum(len(turn.completion_ids or ()) for t in trajectories for turn in t.turns)
    summary: dict[str, Any] = {
        "episodes": len(trajectories),
        "status": {s: c for s, c in Counter(t.status for t in trajectories).items()},
        "reward/mean": fmean(rewards) if rewards else None,
        "reward/std": pstdev(rewards) if rewards else None,
        "turns/mean": fmean(turns) if turns else None,
        "tools/errors": tool_errors,
        "tokens/completion": tokens,
    }
    for name in score_names:
        values = [v for t in scored if (v := t.scores.get(name)) is not None]
        summary[f"scores/{name}"] = fmean(values) if values else None
    if wall_seconds is not None:
        summary["time/wall_seconds"] = wall_seconds
        count = len(trajectories) if played is None else played
        summary["time/episodes_per_second"] = count / wall_seconds if wall_seconds else None
    for status in STATUSES:
        summary["status"].setdefault(status, 0)
    return summary

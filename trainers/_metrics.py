"""Step metrics from trajectories: what the episodes did, namespaced as ``reward/``, ``rollout/``.

Pure functions of the trajectories (no model, no engine), so they are the same for training
steps and evaluation and are tested on hand-built trajectories.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from agentgym import Trajectory


def is_multi_turn_success(trajectory: Trajectory) -> bool:
    """Ended on its own with full reward, after calling a tool and reading its result.

    The quickstart's figure: a right final answer alone (a lucky guess without the tool) is
    not a success of a tool-calling agent.
    """
    used_tool = any(m.get("role") == "tool" for m in trajectory.messages)
    return (
        trajectory.status == "ok"
        and (trajectory.final_reward or 0.0) >= 1.0
        and used_tool
        and len(trajectory.turns) >= 2
    )


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def episode_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Reward, per-function scores, lengths, turns, tool use and outcomes of one step."""
    scored = [t for t in trajectories if t.status not in ("infra_error", "late")]
    rewards = [t.total_reward for t in scored]
    metrics: dict[str, float] = {
        "reward/mean": _mean(rewards),
        "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward/success": _mean([float(is_multi_turn_success(t)) for t in scored]),
    }
    names = sorted({name for t in scored for name in t.scores})
    for name in names:
        values = [v for t in scored if (v := t.scores.get(name)) is not None]
        metrics[f"reward/{name}/mean"] = _mean(values)
    turns = [turn for t in scored for turn in t.turns]
    calls = sum(len(m.get("tool_calls") or []) for t in scored for m in t.messages)
    errors = sum(len(turn.tool_errors) for turn in turns)
    metrics |= {
        "rollout/episodes": float(len(trajectories)),
        "rollout/turns_per_episode": _mean([float(len(t.turns)) for t in scored]),
        "rollout/completion_length": _mean([float(len(t.completion_ids or [])) for t in turns]),
        "rollout/tool_calls_per_episode": calls / len(scored) if scored else 0.0,
        "rollout/tool_error_rate": errors / calls if calls else 0.0,
    }
    for status in ("truncated", "error", "infra_error", "late"):
        metrics[f"rollout/frac_{status}"] = _mean([float(t.status == status) for t in trajectories])
    # ended with reward 0 by a call that destroyed what they are scored on (`Forfeit`)
    metrics["rollout/frac_forfeit"] = _mean([float("forfeit" in t.info) for t in trajectories])
    return metrics


def eval_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Held-out figures: multi-turn success, reward and tool use over every episode played."""
    step = episode_metrics(trajectories)
    return {
        "eval/success": _mean([float(is_multi_turn_success(t)) for t in trajectories]),
        "eval/reward": step["reward/mean"],
        "eval/tool_calls_per_episode": step["rollout/tool_calls_per_episode"],
        "eval/episodes": float(len(trajectories)),
    }

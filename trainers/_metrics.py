"""Step metrics: what the episodes did (``reward/``, ``rollout/``), and parts' metrics combined.

Pure functions of the trajectories (no model, no engine), so they are the same for training
steps and evaluation and are tested on hand-built trajectories; `combine_metrics` makes one
step's figures from its passes', iterations' and processes'.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from agentgym import Trajectory
from agentgym._tool_env import MALFORMED_CALL


def is_multi_turn_success(trajectory: Trajectory) -> bool:
    """Ended on its own with full reward, after calling a tool and reading its result.

    The quickstart's figure: a right final answer alone (a lucky guess without the tool) is
    not a success of a tool-calling agent. The error message answering a call that could not be
    parsed is no tool's result: a malformed call, then the right answer, is a guess.
    """
    used_tool = any(_is_tool_result(m) for m in trajectory.messages)
    return (
        trajectory.status == "ok"
        and (trajectory.final_reward or 0.0) >= 1.0
        and used_tool
        and len(trajectory.turns) >= 2
    )


def _is_tool_result(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "tool" and message.get("name") != MALFORMED_CALL


def _malformed_calls(trajectory: Trajectory) -> int:
    return sum(m.get("role") == "tool" and m.get("name") == MALFORMED_CALL
               for m in trajectory.messages)  # fmt: skip


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def episode_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Reward, per-function scores, lengths, turns, tool use and outcomes of one step.

    What the scored episodes did is absent, not 0, when none was scored (`_is_scored`): a step
    that missed its deadline in every episode logged reward 0, no tool calls and one turn per
    episode, and the health rules then advised a warm start.
    """
    metrics = _outcome_metrics(trajectories)
    scored = [t for t in trajectories if _is_scored(t)]
    return metrics | _scored_metrics(scored) if scored else metrics


def _is_scored(trajectory: Trajectory) -> bool:
    """Whether an episode's reward, turns and tool use count in the step's figures.

    Not a dropped one (``infra_error``, ``late``), nor one that ended ``error`` before its
    first turn (the env's setup raised): no reward was computed and the model did nothing, so
    a step of those logged reward 0, no turn and no tool error. An ``error`` episode that
    played counts, with the reward it got (its advantage caps that at its group's worst).
    """
    if trajectory.status in ("infra_error", "late"):
        return False
    return trajectory.status != "error" or bool(trajectory.turns)


def _outcome_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """How a step's episodes ended: their count and the share of each outcome."""
    metrics = {"rollout/episodes": float(len(trajectories))}
    for status in ("truncated", "error", "infra_error", "late"):
        metrics[f"rollout/frac_{status}"] = _mean([float(t.status == status) for t in trajectories])
    # ended with reward 0 by a call that destroyed what they are scored on (`Forfeit`)
    metrics["rollout/frac_forfeit"] = _mean([float("forfeit" in t.info) for t in trajectories])
    return metrics


def _scored_metrics(scored: Sequence[Trajectory]) -> dict[str, float]:
    """What the scored episodes (at least one) did: reward, scores, turns and tool use."""
    rewards = [t.total_reward for t in scored]
    metrics: dict[str, float] = {
        "reward/mean": _mean(rewards),
        "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward/success": _mean([float(is_multi_turn_success(t)) for t in scored]),
    }
    names = sorted({name for t in scored for name in t.scores})
    for name in names:
        values = [v for t in scored if (v := t.scores.get(name)) is not None]
        if values:  # a function that raised on every episode returned nothing: absent, not 0
            metrics[f"reward/{name}/mean"] = statistics.fmean(values)
    turns = [turn for t in scored for turn in t.turns]
    calls = sum(len(m.get("tool_calls") or []) for t in scored for m in t.messages)
    # a turn's tool errors include its calls that could not be parsed: count those as attempts
    # too, or a step of only malformed calls logged a tool-error rate of 0
    errors = sum(len(turn.tool_errors) for turn in turns)
    cut = sum(turn.tool_results_cut for turn in turns)
    attempts = calls + sum(_malformed_calls(t) for t in scored)
    return metrics | {
        "rollout/turns_per_episode": _mean([float(len(t.turns)) for t in scored]),
        "rollout/completion_length": _mean([float(len(t.completion_ids or [])) for t in turns]),
        # turns that hit max_completion_length (TRL's completions/clipped_ratio): a call cut
        # there reads as a malformed call, not as a truncated episode
        "rollout/frac_turns_cut": _mean([float(t.finish_reason == "length") for t in turns]),
        "rollout/tool_calls_per_episode": calls / len(scored),
        "rollout/tool_error_rate": errors / attempts if attempts else 0.0,
        # results longer than the env's max_tool_result_chars: the model read their start only
        "rollout/frac_tool_results_cut": cut / calls if calls else 0.0,
    }


def eval_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Held-out figures: multi-turn success, reward and tool use over the episodes played.

    An ``infra_error`` episode (a sandbox or server that failed) says nothing of the model: it
    is counted apart (``eval/infra_errors``), as training leaves it out of its groups, where
    it used to count as a failure, so a broken sandbox read "held-out success 0%". With no
    episode left, ``eval/success`` is absent, not 0. A ``late`` one counts as not solved.
    """
    played = [t for t in trajectories if t.status != "infra_error"]
    step = episode_metrics(trajectories)
    metrics = {
        "eval/episodes": float(len(trajectories)),
        "eval/infra_errors": float(len(trajectories) - len(played)),
    }
    if "reward/mean" in step:  # some episode was scored
        metrics["eval/reward"] = step["reward/mean"]
        metrics["eval/tool_calls_per_episode"] = step["rollout/tool_calls_per_episode"]
    if played:
        metrics["eval/success"] = _mean([float(is_multi_turn_success(t)) for t in played])
    return metrics


def combine_metrics(
    parts: Sequence[tuple[Mapping[str, float], float]],
    summed: Collection[str] = ("loss/value",),
) -> dict[str, float]:
    """One step's metrics from its parts' (metrics, weight).

    The parts are an optimiser step's forward passes or the processes of a torchrun step,
    weighted by their trained tokens, or a step's iterations (``num_iterations``) weighted
    alike with nothing ``summed``. Passes differ in size (one long episode may go alone), so
    a plain mean over them would let a pass of a few tokens count as much as all the others
    (a step's entropy logged at 0.21 where its tokens averaged under 0.05). Means are
    weighted (a plain mean where no part has weight); ``*_min`` / ``*_max`` take the extreme;
    ``summed`` names add up (each pass holds its part of the step's loss).
    """
    names = dict.fromkeys(name for metrics, _ in parts for name in metrics)
    out: dict[str, float] = {}
    for name in names:
        pairs = [(metrics[name], weight) for metrics, weight in parts if name in metrics]
        values = [value for value, _ in pairs]
        if name.endswith("_min"):
            out[name] = min(values)
        elif name.endswith("_max"):
            out[name] = max(values)
        elif name in summed:
            out[name] = sum(values)
        else:
            total = sum(weight for _, weight in pairs)
            out[name] = (sum(value * weight for value, weight in pairs) / total if total
                         else sum(values) / len(values))  # fmt: skip
    return out

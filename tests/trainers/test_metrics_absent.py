"""Figures of nothing measured are absent, not 0: what the fault probe's runs logged.

An env whose setup raised on every episode logged reward 0, no tool error and 0 turns a step;
a reward function that raised on every episode logged its mean as 0; and a run of two steps
of errors alone read "no known problem in the metrics".
"""

from __future__ import annotations

import pytest

from agentgym import Trajectory, Turn
from agentgym.trainers._health import HealthWatch, diagnose, format_findings
from agentgym.trainers._metrics import episode_metrics, eval_metrics

CALL = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calculate"}}]}
RESULT = {"role": "tool", "content": "42"}
OUTCOMES = {
    "rollout/episodes", "rollout/frac_truncated", "rollout/frac_error",
    "rollout/frac_infra_error", "rollout/frac_late", "rollout/frac_forfeit",
}  # fmt: skip


def played(status: str, reward: float, scores: dict[str, float | None] | None = None) -> Trajectory:
    """An episode of two turns with a tool call and its result."""
    return Trajectory(env_id="x", status=status, final_reward=reward, scores=scores or {},
                      messages=[CALL, RESULT, {"role": "assistant", "content": "42"}],
                      turns=[Turn(completion_ids=[1, 2, 3]), Turn(completion_ids=[4])])  # fmt: skip


def setup_failed() -> Trajectory:
    """What the rollout records when the env's setup_episode raises: no turn, no reward."""
    return Trajectory(env_id="x", status="error", error="Traceback ...\nRuntimeError: setup")


def test_a_step_whose_setup_failed_in_every_episode_logs_no_reward_turn_or_tool_figures() -> None:
    m = episode_metrics([setup_failed()] * 4)
    assert m.keys() == OUTCOMES  # was reward/mean 0.0, rollout/tool_error_rate 0.0, ...
    assert m["rollout/frac_error"] == 1.0
    evaluated = eval_metrics([setup_failed()] * 2)
    assert evaluated == {"eval/episodes": 2.0, "eval/infra_errors": 0.0, "eval/success": 0.0}


def test_an_error_episode_counts_in_the_figures_when_it_played() -> None:
    """A reward function's error after the model played: its reward and turns are the
    policy's (the trainer scores it); a setup error before the first turn is not."""
    m = episode_metrics([played("ok", 1.0), played("error", 0.0), setup_failed()])
    assert m["reward/mean"] == pytest.approx(0.5)  # was 1/3: the setup error counted as 0
    assert m["rollout/turns_per_episode"] == 2.0  # was 4/3
    assert m["rollout/tool_calls_per_episode"] == 1.0
    assert m["rollout/frac_error"] == pytest.approx(2 / 3)


def test_a_reward_function_that_raised_on_every_episode_logs_no_mean() -> None:
    episodes = [played("error", 0.5, {"score": None, "format": 0.5})] * 3
    m = episode_metrics(episodes)
    assert "reward/score/mean" not in m  # was 0.0: the function never returned a value
    assert m["reward/format/mean"] == 0.5 and m["reward/mean"] == 0.5
    some = episode_metrics([*episodes, played("ok", 1.0, {"score": 1.0, "format": 1.0})])
    assert some["reward/score/mean"] == 1.0  # the mean of the values it returned


def steps(episodes: list[Trajectory], count: int) -> list[dict]:
    return [{"step": step, **episode_metrics(episodes)} for step in range(1, count + 1)]


@pytest.mark.parametrize(("episodes", "rules"), [
    ([setup_failed()] * 4, ["errors"]),
    ([played("error", 0.0, {"score": None})] * 4, ["errors"]),
    ([Trajectory(env_id="x", status="late"), setup_failed()] * 2, ["errors", "late"]),
    ([Trajectory(env_id="x", status="infra_error")] * 4, ["infra-errors"]),
])  # fmt: skip
def test_two_steps_of_failed_episodes_alone_are_reported(
    episodes: list[Trajectory], rules: list[str]
) -> None:
    """The trainer stops at the third such step; a run of max_steps 2 read "no known problem"."""
    for count in (1, 2):
        found = diagnose(steps(episodes, count))
        assert [f.rule for f in found] == rules, count
        assert "no known problem" not in format_findings(found)[0]
    watch = HealthWatch([{"step": 0, "eval/success": 0.0}])
    assert [f.rule for f in watch.see(1, steps(episodes, 1)[0])] == rules


def test_a_short_run_with_some_episodes_played_still_waits_for_three_steps() -> None:
    """Half the episodes erred: that may be noise, judged from `MIN_STEPS` steps as before."""
    assert diagnose(steps([played("ok", 1.0), played("error", 0.0)], 2)) == []
    rows = [{"step": 1, **episode_metrics([setup_failed()] * 2)},
            {"step": 2, **episode_metrics([played("ok", 1.0)] * 2)}]  # fmt: skip
    assert diagnose(rows) == []  # one step of errors, then one that played

"""Step metrics on hand-built trajectories: what counts, over which episodes."""

from __future__ import annotations

import pytest

from agentgym import Trajectory, Turn
from agentgym.trainers._metrics import combine_metrics, episode_metrics, eval_metrics

CALL = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calculate"}}]}
RESULT = {"role": "tool", "content": "42"}


def episode(status: str, reward: float | None, *, tool: bool = True, errors: int = 0,
            forfeit: bool = False) -> Trajectory:  # fmt: skip
    messages = [CALL, RESULT, {"role": "assistant", "content": "42"}] if tool else []
    turns = [Turn(completion_ids=[1, 2, 3], tool_errors=["e"] * errors), Turn(completion_ids=[4])]
    t = Trajectory(env_id="x", status=status, final_reward=reward, messages=messages, turns=turns)
    if forfeit:
        t.info["forfeit"] = "wreck: the world is gone"
    return t


def test_rewards_and_rates_leave_out_what_the_trainer_drops() -> None:
    """infra_error and late episodes are not the policy's: they are left out of the reward
    and rollout figures, and counted among the outcomes with the forfeits."""
    episodes = [
        episode("ok", 1.0),
        episode("ok", 0.0, errors=1, forfeit=True),
        episode("error", 0.0, tool=False),
        episode("infra_error", None),
        episode("late", None),
    ]
    m = episode_metrics(episodes)
    assert m["reward/mean"] == pytest.approx(1 / 3)
    assert m["reward/success"] == pytest.approx(1 / 3)  # the tool, its result, reward 1.0
    assert m["rollout/episodes"] == 5.0
    assert m["rollout/tool_calls_per_episode"] == pytest.approx(2 / 3)
    assert m["rollout/tool_error_rate"] == pytest.approx(1 / 2)
    assert m["rollout/completion_length"] == pytest.approx(2.0)
    for outcome, count in {"error": 1, "infra_error": 1, "late": 1, "forfeit": 1}.items():
        assert m[f"rollout/frac_{outcome}"] == pytest.approx(count / 5), outcome


def test_eval_success_counts_every_episode_the_model_played() -> None:
    """An infra_error episode (a failed sandbox or server) is counted apart, not as a failure:
    a broken sandbox read "held-out success 0%"."""
    m = eval_metrics([episode("ok", 1.0), episode("ok", 1.0, tool=False), episode("late", None),
                      episode("infra_error", None)])  # fmt: skip
    assert m["eval/success"] == pytest.approx(1 / 3)  # a right answer without the tool is not
    assert m["eval/episodes"] == 4.0 and m["eval/infra_errors"] == 1.0


def test_an_eval_of_infra_errors_alone_measures_no_success() -> None:
    m = eval_metrics([episode("infra_error", None)] * 3)
    assert "eval/success" not in m and m["eval/infra_errors"] == 3.0


@pytest.mark.parametrize("status", ["late", "infra_error"])
def test_a_step_with_no_scored_episode_logs_its_outcomes_and_no_made_up_figures(
    status: str,
) -> None:
    """Every episode past its deadline: the step logged reward 0, no tool calls and one turn
    per episode (0 in fact), and health read that as a model that never calls its tool."""
    m = episode_metrics([episode(status, None)] * 4)
    assert m == {
        "rollout/episodes": 4.0, "rollout/frac_truncated": 0.0, "rollout/frac_error": 0.0,
        "rollout/frac_infra_error": float(status == "infra_error"),
        "rollout/frac_late": float(status == "late"), "rollout/frac_forfeit": 0.0,
    }  # fmt: skip
    assert eval_metrics([episode(status, None)] * 2).keys() == {
        "eval/episodes", "eval/infra_errors", *(["eval/success"] if status == "late" else [])
    }


def test_a_steps_metrics_weigh_its_passes_by_their_tokens() -> None:
    """A pass of 10 tokens counts a tenth of one of 90; extremes stay extremes; losses add."""
    big = {"loss/entropy": 0.02, "sampling/is_ratio_max": 1.5, "sampling/is_ratio_min": 0.9,
           "loss/value": -0.3}  # fmt: skip
    small = {"loss/entropy": 0.8, "sampling/is_ratio_max": 1.1, "sampling/is_ratio_min": 0.7,
             "loss/value": -0.1, "loss/high_entropy_share": 0.5}  # fmt: skip
    step = combine_metrics([(big, 90.0), (small, 10.0)])
    assert step["loss/entropy"] == pytest.approx(0.02 * 0.9 + 0.8 * 0.1)  # not (0.02 + 0.8) / 2
    assert step["sampling/is_ratio_max"] == 1.5 and step["sampling/is_ratio_min"] == 0.7
    assert step["loss/value"] == pytest.approx(-0.4)  # each pass holds its part of the loss
    assert step["loss/high_entropy_share"] == 0.5  # reported by one pass only
    iterations = combine_metrics([(step, 1.0), ({**step, "loss/value": -0.2}, 1.0)], summed=())
    assert iterations["loss/value"] == pytest.approx(-0.3)  # iterations average
    assert combine_metrics([({"loss/kl": 0.2}, 0.0), ({"loss/kl": 0.4}, 0.0)]) == {
        "loss/kl": pytest.approx(0.3)
    }  # passes without trained tokens: a plain mean



def test_tool_results_cut_to_be_shown_are_a_share_of_the_scored_calls() -> None:
    """The model read only the start of those results: a run should say how many."""
    cut = episode("ok", 0.0)
    cut.turns[0].tool_results_cut = 1
    dropped = episode("infra_error", None)
    dropped.turns[0].tool_results_cut = 1
    m = episode_metrics([cut, episode("ok", 1.0), episode("ok", 1.0), episode("ok", 1.0), dropped])
    assert m["rollout/frac_tool_results_cut"] == pytest.approx(1 / 4)  # 1 of 4 scored calls
    assert episode_metrics([episode("ok", 1.0, tool=False)])["rollout/frac_tool_results_cut"] == 0


def test_turns_cut_at_the_token_limit_are_counted_over_the_scored_turns() -> None:
    """A call cut at max_completion_length reads as a malformed call: the cut is its cause."""
    cut = episode("ok", 0.0)
    cut.turns[0].finish_reason = "length"
    whole = episode("ok", 1.0)
    whole.turns[0].finish_reason = whole.turns[1].finish_reason = "stop"
    dropped = episode("infra_error", None)
    dropped.turns[0].finish_reason = "length"
    m = episode_metrics([cut, whole, dropped])
    assert m["rollout/frac_turns_cut"] == pytest.approx(1 / 4)  # 1 of the 4 scored turns

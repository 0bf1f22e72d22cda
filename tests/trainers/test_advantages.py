"""Group advantages: TRL's arithmetic, infra_error exclusion, zero-variance reporting."""

from __future__ import annotations

import math

import pytest

from agentgym import Trajectory, Turn
from agentgym.trainers._advantages import (
    STD_EPS,
    group_advantages,
    mask_truncated,
    trajectory_advantages,
    unbiased_std,
)


def test_group_scaling_matches_the_formula() -> None:
    result = group_advantages([1.0, 0.0, 0.0, 3.0, 1.0], ["a", "a", "a", "b", "b"], ["ok"] * 5)
    std_a = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    assert result.values[0] == pytest.approx((1 - 1 / 3) / (std_a + STD_EPS))
    assert result.values[1] == pytest.approx((0 - 1 / 3) / (std_a + STD_EPS))
    assert result.values[3] == pytest.approx(1 / (math.sqrt(2) + STD_EPS))
    assert result.num_groups == 2 and result.zero_variance_groups == []


def test_batch_and_none_scaling() -> None:
    rewards, groups = [1.0, 0.0, 4.0, 2.0], [0, 0, 1, 1]
    batch = group_advantages(rewards, groups, ["ok"] * 4, "batch")
    scale = unbiased_std(rewards) + STD_EPS
    assert batch.values == pytest.approx([0.5 / scale, -0.5 / scale, 1 / scale, -1 / scale])
    assert group_advantages(rewards, groups, ["ok"] * 4, "none").values == [0.5, -0.5, 1, -1]


def test_infra_error_does_not_change_its_groups_other_advantages() -> None:
    rewards = [1.0, 0.0, 0.5]
    clean = group_advantages(rewards, [0, 0, 0], ["ok", "ok", "ok"])
    # the same group plus an infra_error episode that was (wrongly) scored 0
    with_infra = group_advantages(rewards + [0.0], [0, 0, 0, 0], ["ok", "ok", "ok", "infra_error"])
    assert with_infra.values[:3] == clean.values
    assert with_infra.values[3] is None
    assert with_infra.kept == [0, 1, 2]
    assert with_infra.num_infra_error == 1


@pytest.mark.parametrize(
    ("late_policy", "kept"),
    [("drop", [0, 1, 3, 4]), ("drop_group", [3, 4]), ("zero", [0, 1, 2, 3, 4])],
)
def test_each_late_policy_keeps_what_it_says(late_policy: str, kept: list[int]) -> None:
    # group 0: a success, a failure, and a late episode (its reward, if any, is not counted)
    statuses = ["ok", "ok", "late", "ok", "ok"]
    result = group_advantages([1.0, 0.0, 0.9, 1.0, 0.0], [0, 0, 0, 1, 1], statuses,
                              late_policy=late_policy)  # type: ignore[arg-type]  # fmt: skip
    assert result.kept == kept and result.num_late == 1


def test_a_late_episode_scored_zero_is_punished_like_a_failure() -> None:
    # running out the clock must not spare a policy its bad score
    zero = group_advantages([1.0, 0.0, 0.9], [0, 0, 0], ["ok", "ok", "late"], late_policy="zero")
    failed = group_advantages([1.0, 0.0, 0.0], [0, 0, 0], ["ok", "ok", "ok"])
    assert zero.values == failed.values and zero.values[2] is not None and zero.values[2] < 0


@pytest.mark.parametrize("late_policy", ["drop", "drop_group", "zero"])
def test_a_late_episode_that_never_started_is_dropped_under_every_policy(
    late_policy: str,
) -> None:
    # the deadline came before a slot freed: no turn played, nothing the policy did
    result = group_advantages([1.0, 0.0, 0.0], [0, 0, 0], ["ok", "ok", "late"],
                              late_policy=late_policy,  # type: ignore[arg-type]
                              started=[True, True, False])  # fmt: skip
    assert result.values[2] is None and result.num_late == 1
    assert result.kept == ([] if late_policy == "drop_group" else [0, 1])


def test_a_masked_truncated_episode_trains_nothing_and_still_sets_its_groups_baseline() -> None:
    episodes = [
        Trajectory(env_id="e", task_position=0, final_reward=r, status=s)
        for r, s in ((1.0, "ok"), (0.0, "truncated"), (0.0, "ok"), (0.5, "ok"))
    ]
    unmasked = trajectory_advantages(episodes).values
    masked = mask_truncated(unmasked, episodes)
    assert masked[1] is None and unmasked[1] is not None and unmasked[1] < 0
    # the truncated 0.0 still pulled the group's mean down: the others keep their values
    assert [masked[i] for i in (0, 2, 3)] == [unmasked[i] for i in (0, 2, 3)]
    assert mask_truncated(unmasked, [episodes[0]] * 4) == unmasked
    # an answer stopped at its token limit was cut off too (TRL: no EOS at the end)
    cut = Trajectory(env_id="e", turns=[Turn(finish_reason="stop"), Turn(finish_reason="length")])
    done = Trajectory(env_id="e", turns=[Turn(finish_reason="length"), Turn(finish_reason="stop")])
    assert mask_truncated([0.5, 0.5], [cut, done]) == [None, 0.5]


def test_error_episodes_are_scored_and_counted() -> None:
    result = group_advantages([1.0, 0.0], [0, 0], ["ok", "error"])
    assert result.values[1] is not None and result.values[1] < 0
    assert result.num_error == 1
    assert result.metrics()["rollout/error_episodes"] == 1.0


def test_zero_variance_and_singleton_groups_get_zero_and_are_reported() -> None:
    result = group_advantages(
        [1.0, 1.0, 0.0, 1.0, 0.3], ["same", "same", "mixed", "mixed", "alone"],
        ["ok", "ok", "ok", "ok", "ok"],
    )
    assert result.values[:2] == [0.0, 0.0] and result.values[4] == 0.0
    assert result.zero_variance_groups == ["same", "alone"]
    assert result.metrics()["reward/frac_zero_variance_groups"] == pytest.approx(2 / 3)


def test_a_group_of_only_infra_errors_trains_nothing() -> None:
    result = group_advantages([0.0, 0.0], [5, 5], ["infra_error", "infra_error"])
    assert result.values == [None, None]
    assert result.zero_variance_groups == [5]


def test_trajectories_group_by_task_position_then_index() -> None:
    def episode(position: int | None, index: int | None, reward: float) -> Trajectory:
        return Trajectory("calc", task_position=position, task_index=index, final_reward=reward)

    # the same task index played at two positions makes two groups
    result = trajectory_advantages([episode(0, 7, 1.0), episode(0, 7, 0.0), episode(1, 7, 1.0),
                                    episode(1, 7, 1.0), episode(None, 3, 0.0)])
    assert result.num_groups == 3
    assert result.zero_variance_groups == [1, 3]
    assert result.values[0] is not None and result.values[0] > 0


def test_parallel_lists_must_match() -> None:
    with pytest.raises(ValueError, match="parallel"):
        group_advantages([1.0], [0, 0], ["ok"])

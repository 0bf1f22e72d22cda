"""Group advantages: TRL's arithmetic, infra_error exclusion, zero-variance reporting."""

from __future__ import annotations

import math

import pytest

from agentgym import Trajectory, Turn
from agentgym.trainers._advantages import (
    STD_EPS,
    decoupled_advantages,
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


def test_an_error_episode_whose_setup_raised_leaves_its_group() -> None:
    """The env's setup raised before the model's first turn: scored as the group's worst, it
    kept a group of two successes flat (a fault probe: every group "zero variance")."""
    result = group_advantages([1.0, 0.0, 1.0], [0, 0, 0], ["ok", "error", "ok"],
                              started=[True, False, True])  # fmt: skip
    assert result.values[1] is None and result.kept == [0, 2] and result.num_error == 1
    played = group_advantages([1.0, 0.0, 1.0], [0, 0, 0], ["ok", "error", "ok"])
    assert played.values[1] is not None and played.values[1] < 0  # an error that played stays


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


def test_an_error_episode_never_scores_above_its_groups_worst_sound_one() -> None:
    """The model's reply made a negative-weight reward function raise: the episode kept the
    sum of the others (1.0) where the honest reply scored 0.0, so GRPO taught the crash."""
    result = group_advantages([1.0, 0.0, 0.5], [0, 0, 0], ["error", "ok", "ok"])
    assert result.values[0] == pytest.approx(result.values[1])  # capped at 0.0, the worst
    assert result.values[0] < 0 < result.values[2]
    low = group_advantages([-2.0, 0.0, 0.5], [0, 0, 0], ["error", "ok", "ok"])
    assert low.values[0] < low.values[1]  # a lower reward of its own stands
    alone = group_advantages([1.0, 1.0], [0, 0], ["error", "error"])
    assert alone.values == [0.0, 0.0]  # no sound episode to cap by: equal, no signal


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
    assert result.zero_variance_groups == [5]  # replayed by resample_zero_variance_groups


def test_groups_with_no_scored_episode_are_not_counted_as_flat() -> None:
    """A step whose every episode was late logged 100% of its groups flat, and the health
    rules read "nothing succeeds"; the share is over the groups that were scored."""
    result = group_advantages(
        [0.0, 0.0, 1.0, 1.0, 0.0, 1.0], ["late", "late", "flat", "flat", "mixed", "mixed"],
        ["late", "late", "ok", "ok", "ok", "ok"],
    )  # fmt: skip
    assert result.zero_variance_groups == ["late", "flat"]
    metrics = result.metrics()
    assert metrics["reward/groups"] == 3.0 and metrics["reward/zero_variance_groups"] == 1.0
    assert metrics["reward/frac_zero_variance_groups"] == pytest.approx(1 / 2)
    all_late = group_advantages([0.0] * 4, [1, 1, 2, 2], ["late"] * 4).metrics()
    assert "reward/frac_zero_variance_groups" not in all_late and all_late["reward/groups"] == 2.0


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


# --- GDPO: multi_objective_aggregation="normalize_then_sum" -------------------------------------


def test_gdpo_keeps_a_narrow_reward_from_drowning_under_a_wide_one() -> None:
    """Scores (wide 0/100, narrow 0/1): summed, earning only the narrow reward looks like
    earning nothing; normalised apart, it counts as much as earning only the wide one."""
    rows = [[100.0, 0.0], [0.0, 1.0], [0.0, 0.0], [100.0, 1.0]]
    groups, statuses = ["a"] * 4, ["ok"] * 4
    gdpo = decoupled_advantages(rows, [1.0, 1.0], groups, statuses).values
    summed = group_advantages([sum(r) for r in rows], groups, statuses).values
    assert gdpo[0] == pytest.approx(gdpo[1], abs=1e-3)  # up to the 1e-4 added to each std
    assert gdpo[3] > gdpo[0] > gdpo[2]
    assert summed[1] - summed[2] < 0.02 * (summed[0] - summed[2])  # the narrow one drowned
    assert sum(gdpo) == pytest.approx(0.0, abs=1e-9)
    assert unbiased_std(gdpo) == pytest.approx(1.0, rel=1e-3)  # normalised over the step


def test_gdpo_with_one_reward_is_the_group_score_normalised_over_the_step() -> None:
    rewards, groups = [1.0, 0.0, 0.0, 3.0, 1.0, 2.0], ["a", "a", "a", "b", "b", "b"]
    statuses = ["ok"] * 6
    per_group = group_advantages(rewards, groups, statuses, "group").values
    mean, std = sum(per_group) / 6, unbiased_std(per_group)
    gdpo = decoupled_advantages([[r] for r in rewards], [2.0], groups, statuses).values
    # a weight scales every sum alike, so the step's normalisation takes it out again
    assert gdpo == pytest.approx([(v - mean) / (std + STD_EPS) for v in per_group], rel=1e-3)


def test_gdpo_skips_a_score_that_raised_and_leaves_dropped_episodes_out() -> None:
    rows = [[1.0, 1.0], [0.0, None], [1.0, 0.0], [None, None], [5.0, 5.0], [0.0, 0.0]]
    groups = ["a", "a", "a", "a", "b", "b"]
    statuses = ["ok", "error", "ok", "ok", "infra_error", "ok"]
    result = decoupled_advantages(rows, [1.0, 0.5], groups, statuses)
    assert result.values[3] == 0.0  # nothing scored: no signal
    assert result.values[4] is None and result.num_infra_error == 1  # dropped, not scored 0
    assert result.values[5] == 0.0 and result.zero_variance_groups == ["b"]  # alone in b
    without_dropped = decoupled_advantages(rows[:4], [1.0, 0.5], groups[:4], statuses[:4])
    assert result.values[:4] == pytest.approx(without_dropped.values)


def test_gdpo_scores_a_penalty_that_raised_as_the_groups_worst_on_it() -> None:
    """Skipped, the raised penalty left the crashing reply level with the honest ones."""
    rows = [[1.0, None], [1.0, 0.0], [1.0, 2.0], [0.0, 0.0]]  # [correct, penalty]
    result = decoupled_advantages(rows, [1.0, -1.0], [0] * 4, ["error", "ok", "ok", "ok"])
    assert result.values[0] == pytest.approx(result.values[2])  # as the worst penalty, 2.0
    assert result.values[0] < result.values[1]


def test_gdpo_reports_a_group_flat_when_only_unweighted_scores_vary() -> None:
    rows = [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0]]  # a: weighted score equal
    result = decoupled_advantages(rows, [1.0, 0.0], ["a", "a", "b", "b"], ["ok"] * 4)
    assert result.zero_variance_groups == ["a"]
    assert result.values[0] == result.values[1]


def test_trajectory_advantages_read_the_rubric_scores_and_step_rewards() -> None:
    def episode(group: int, correct: float, used: float, step: float = 0.0) -> Trajectory:
        t = Trajectory(env_id="x", task_position=group, turns=[Turn(reward=step)],
                       final_reward=correct, scores={"correct": correct, "used": used})
        return t

    weights = {"correct": 1.0, "used": 0.0}
    plain = [episode(0, 1.0, 1.0), episode(0, 0.0, 1.0), episode(1, 1.0, 0.0), episode(1, 0.0, 0.0)]
    gdpo = trajectory_advantages(plain, reward_weights=weights).values
    assert gdpo == pytest.approx(decoupled_advantages(
        [[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]], [1.0, 0.0], [0, 0, 1, 1], ["ok"] * 4
    ).values)  # fmt: skip
    stepped = [*plain[:3], episode(1, 0.0, 0.0, step=0.5)]  # step rewards: one more component
    with_steps = trajectory_advantages(stepped, reward_weights=weights).values
    assert with_steps == pytest.approx(decoupled_advantages(
        [[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.5]],
        [1.0, 0.0, 1.0], [0, 0, 1, 1], ["ok"] * 4,
    ).values)  # fmt: skip

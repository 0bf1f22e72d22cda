"""Group-normalised advantages over episodes, in plain Python (no torch).

GRPO's baseline is the mean reward of the other episodes of the same task (the group). What
enters that baseline matters more than the formula:

- ``infra_error`` episodes (model backend or sandbox failed) say nothing about the policy:
  they are left out of their group's statistics entirely and get no advantage (``None``,
  dropped from training). Scoring them 0 would punish the policy for a crashed container.
  ``late`` episodes (the step's deadline passed first: no reward) are dropped the same way,
  and with ``late_policy="drop_group"`` their whole group is dropped. With ``"zero"`` they
  stay in their group with reward 0: a policy that expects a low score could otherwise learn
  to run out the clock, since a dropped episode is never scored. A late episode that never
  started (no slot freed before the deadline) is dropped under every policy: it played no
  turn, so its lateness says nothing about the policy. So is an ``error`` episode that never
  started (the env's setup raised before the model's first turn): the model did nothing, and
  scored as its group's worst it flattened the group (a probe: every group "zero variance").
- ``error`` episodes (the env, a tool loop or a reward function raised) are kept: the reward
  they got is data about the policy's behaviour. They are counted so a rise is visible. An
  error episode scores no more than the worst other kept episode of its group: the model's
  reply can make a reward function raise, and the episode kept the sum of the others, so
  crashing a negative-weight penalty out-scored the honest reply (a probe: 1.0 against 0.0).
- Groups whose kept rewards are all equal (zero variance, or a single kept episode) carry no
  learning signal: their advantages are 0 and their keys are reported.

The arithmetic matches TRL 1.16: group mean baseline; std is the unbiased (n - 1) std of the
group (``scale_rewards="group"``) or of every kept reward of the step (``"batch"``); the
advantage is ``(r - mean) / (std + 1e-4)``, or ``r - mean`` for ``"none"``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from agentgym._trajectory import Status, Trajectory

from ._config import LatePolicy, ScaleRewards

#: Added to the std before dividing, as TRL does, so near-constant groups do not explode.
STD_EPS = 1e-4


@dataclass(frozen=True)
class Advantages:
    """One advantage per episode (None = dropped) and what the step's groups looked like."""

    values: list[float | None]
    #: Keys of groups with no learning signal (equal kept rewards, or fewer than 2 kept).
    zero_variance_groups: list[Hashable] = field(default_factory=list)
    num_groups: int = 0
    #: Groups none of whose episodes was kept (all dropped): in ``zero_variance_groups``,
    #: since they teach nothing either, but not groups whose rewards were alike.
    num_unscored_groups: int = 0
    num_infra_error: int = 0
    num_error: int = 0
    num_late: int = 0

    @classmethod
    def tallied(
        cls, values: list[float | None], flat: list[Hashable],
        members: Mapping[Hashable, Sequence[int]], statuses: Sequence[Status],
    ) -> Advantages:  # fmt: skip
        """The advantages, with the step's group and outcome counts.

        ``members``: each group's kept episodes (an empty list: none was kept).
        """
        return cls(
            values=values, zero_variance_groups=flat, num_groups=len(members),
            num_unscored_groups=sum(not kept for kept in members.values()),
            num_infra_error=sum(s == "infra_error" for s in statuses),
            num_error=sum(s == "error" for s in statuses),
            num_late=sum(s == "late" for s in statuses),
        )  # fmt: skip

    @property
    def kept(self) -> list[int]:
        """Indices of episodes that train (advantage not None)."""
        return [i for i, v in enumerate(self.values) if v is not None]

    def metrics(self) -> dict[str, float]:
        """Namespaced step metrics: group counts and the error tallies.

        The zero-variance figures are over the groups with a scored episode, and absent when
        none has one: a step whose every episode was late logged 100% of groups flat, and the
        health rules read that as "nothing succeeds".
        """
        scored = self.num_groups - self.num_unscored_groups
        flat = len(self.zero_variance_groups) - self.num_unscored_groups
        return {
            "reward/groups": float(self.num_groups),
            **({"reward/zero_variance_groups": float(flat),
                "reward/frac_zero_variance_groups": flat / scored} if scored else {}),
            "rollout/infra_error_episodes": float(self.num_infra_error),
            "rollout/late_episodes": float(self.num_late),
            "rollout/error_episodes": float(self.num_error),
        }  # fmt: skip


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def unbiased_std(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


#: Statuses whose episodes say nothing about the policy: no advantage, not in group statistics.
DROPPED: frozenset[str] = frozenset({"infra_error", "late"})


def _kept_by_group(
    groups: Sequence[Hashable],
    statuses: Sequence[Status],
    late_policy: LatePolicy,
    started: Sequence[bool] | None = None,
) -> dict[Hashable, list[int]]:
    """Episode indices per group key, first-seen order; what ``late_policy`` drops left out."""
    dropped = DROPPED - {"late"} if late_policy == "zero" else DROPPED
    late_groups = {key for key, s in zip(groups, statuses) if s == "late"}
    drop_late_groups = late_policy == "drop_group"
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(groups):
        indices = members.setdefault(key, [])
        never_started = (statuses[i] in ("late", "error")  # the model played no turn
                         and started is not None and not started[i])  # fmt: skip
        if statuses[i] not in dropped and not never_started and not (
            drop_late_groups and key in late_groups
        ):
            indices.append(i)
    return members


def _errors_capped(
    rewards: Sequence[float], statuses: Sequence[Status], members: Mapping[Hashable, list[int]]
) -> list[float]:
    """``rewards``, each ``error`` episode's at most its group's worst kept other episode's."""
    capped = list(rewards)
    for indices in members.values():
        sound = [rewards[i] for i in indices if statuses[i] != "error"]
        for i in indices if sound else ():
            if statuses[i] == "error":
                capped[i] = min(rewards[i], min(sound))
    return capped


def _raised_scored_worst(
    components: Sequence[Sequence[float | None]], weights: Sequence[float],
    statuses: Sequence[Status], members: Mapping[Hashable, list[int]],
) -> list[list[float | None]]:  # fmt: skip
    """Each score an ``error`` episode's function raised on counts as its group's worst on it.

    As `_errors_capped` for summed rewards: a reply that makes a penalty raise must not beat
    the honest replies on that penalty (skipped, it left the episode's other scores alone).
    """
    rows = [list(row) for row in components]
    for indices in members.values():
        for k, weight in enumerate(weights):
            scored = [s for i in indices if (s := rows[i][k]) is not None]
            if not scored or not weight:
                continue
            worst = min(scored) if weight > 0 else max(scored)
            for i in indices:
                if rows[i][k] is None and statuses[i] == "error":
                    rows[i][k] = worst
    return rows


def group_advantages(
    rewards: Sequence[float],
    groups: Sequence[Hashable],
    statuses: Sequence[Status],
    scale_rewards: ScaleRewards = "group",
    late_policy: LatePolicy = "drop",
    started: Sequence[bool] | None = None,
) -> Advantages:
    """Advantages for parallel lists of episode rewards, group keys and statuses.

    Args:
        rewards: each episode's scalar reward (ignored for dropped episodes).
        groups: each episode's group key (e.g. its task index); any hashable.
        statuses: each episode's `agentgym.Trajectory` status.
        scale_rewards: ``group`` | ``batch`` | ``none`` (see the module docstring).
        late_policy: ``drop`` (only late episodes leave) | ``drop_group`` (their groups do)
            | ``zero`` (late episodes stay, with reward 0).
        started: whether each episode played a turn; a late or ``error`` one that did not is
            dropped under every ``late_policy``. None: every episode started.

    Raises:
        ValueError: the three sequences differ in length.
    """
    if not len(rewards) == len(groups) == len(statuses):
        raise ValueError(
            f"rewards, groups and statuses must be parallel lists, got lengths "
            f"{len(rewards)}, {len(groups)}, {len(statuses)}"
        )
    if late_policy == "zero":
        rewards = [0.0 if s == "late" else r for r, s in zip(rewards, statuses)]
    members = _kept_by_group(groups, statuses, late_policy, started)
    rewards = _errors_capped(rewards, statuses, members)
    kept_rewards = [rewards[i] for indices in members.values() for i in indices]
    batch_std = unbiased_std(kept_rewards)
    values: list[float | None] = [None] * len(rewards)
    flat: list[Hashable] = []
    for key, indices in members.items():
        group = [rewards[i] for i in indices]
        std = unbiased_std(group)
        if len(group) < 2 or math.isclose(std, 0.0, abs_tol=1e-12):
            flat.append(key)
            for i in indices:
                values[i] = 0.0
            continue
        mean = _mean(group)
        scale = {"group": std + STD_EPS, "batch": batch_std + STD_EPS, "none": 1.0}[scale_rewards]
        for i in indices:
            values[i] = (rewards[i] - mean) / scale
    return Advantages.tallied(values, flat, members, statuses)


def decoupled_advantages(
    components: Sequence[Sequence[float | None]],
    weights: Sequence[float],
    groups: Sequence[Hashable],
    statuses: Sequence[Status],
    late_policy: LatePolicy = "drop",
    started: Sequence[bool] | None = None,
) -> Advantages:
    """GDPO's advantages (TRL's ``multi_objective_aggregation="normalize_then_sum"``).

    Why: summed before normalising, a reward on a wide scale drowns one on a narrow scale,
    and distinct combinations of rewards collapse to the same advantage (GDPO, Liu et al.
    2026). Each component (a reward function's score, None where it raised) is normalised
    within its group, ``(r - mean) / (std + 1e-4)`` over the members that have it; the
    results are summed with ``weights``; the sums are normalised over the step's kept
    episodes. An episode with no component scored, or alone in its group, gets 0 and stays
    out of the step's statistics, as TRL's NaN rows do. Dropped episodes and ``late_policy``
    are as in `group_advantages` (``zero``: a late episode's components are all 0).

    Raises:
        ValueError: the sequences differ in length, or a row's components differ from
            ``weights`` in number.
    """
    if not len(components) == len(groups) == len(statuses):
        raise ValueError(
            f"components, groups and statuses must be parallel lists, got lengths "
            f"{len(components)}, {len(groups)}, {len(statuses)}"
        )
    if any(len(row) != len(weights) for row in components):
        raise ValueError(f"every episode needs {len(weights)} components, one per weight")
    if late_policy == "zero":
        components = [[0.0] * len(weights) if s == "late" else row
                      for row, s in zip(components, statuses)]  # fmt: skip
    members = _kept_by_group(groups, statuses, late_policy, started)
    components = _raised_scored_worst(components, weights, statuses, members)
    sums: list[float | None] = [None] * len(components)
    flat: list[Hashable] = []
    for key, indices in members.items():
        varied = False
        for k, weight in enumerate(weights):
            present = [i for i in indices if components[i][k] is not None]
            scores = [float(components[i][k]) for i in present]  # type: ignore[arg-type]
            if len(scores) < 2:
                continue
            mean, std = _mean(scores), unbiased_std(scores)
            varied = varied or (weight != 0 and not math.isclose(std, 0.0, abs_tol=1e-12))
            for i, score in zip(present, scores):
                sums[i] = (sums[i] or 0.0) + weight * (score - mean) / (std + STD_EPS)
        if not varied:
            flat.append(key)
    kept = [value for value in sums if value is not None]
    mean, std = (_mean(kept), unbiased_std(kept)) if kept else (0.0, 0.0)
    values: list[float | None] = [None] * len(components)
    for indices in members.values():
        for i in indices:
            value = sums[i]
            values[i] = 0.0 if value is None else (value - mean) / (std + STD_EPS)
    return Advantages.tallied(values, flat, members, statuses)


def group_key(trajectory: Trajectory) -> Hashable:
    """The group an episode belongs to within one rollout call.

    Its ``task_position`` (the slot of its task in the list the rollout played, so a task
    listed twice makes two groups), else its ``task_index``, else its task rendered as text.
    """
    for key in (trajectory.task_position, trajectory.task_index):
        if key is not None:
            return key
    return repr(trajectory.task)


def mask_truncated(
    values: Sequence[float | None], trajectories: Sequence[Trajectory]
) -> list[float | None]:
    """``values`` with the advantage of every cut-off episode set to None (no loss).

    DAPO's overlong filtering (TRL's ``mask_truncated_completions``): an episode that ended
    ``truncated`` (the turn limit, the token budget or the context cut it off), or whose last
    turn stopped at its token limit (TRL's test: the completion does not end in EOS), is
    scored on an answer it never finished, so its tokens are not trained on. Its reward still
    counted in its group's statistics, so the other episodes' advantages are what they would
    be without the mask.
    """
    return [
        None if cut_off(trajectory) else value
        for value, trajectory in zip(values, trajectories, strict=True)
    ]


def cut_off(trajectory: Trajectory) -> bool:
    """Whether the episode was cut off rather than finished (see `mask_truncated`)."""
    last = trajectory.turns[-1] if trajectory.turns else None
    return trajectory.status == "truncated" or (last is not None and last.finish_reason == "length")


def trajectory_advantages(
    trajectories: Sequence[Trajectory],
    scale_rewards: ScaleRewards = "group",
    late_policy: LatePolicy = "drop",
    reward_weights: Mapping[str, float] | None = None,
) -> Advantages:
    """Advantages of trajectories, grouped by `group_key`.

    Without ``reward_weights``: `group_advantages` of each ``total_reward``. With them (the
    rubric's function names and weights): `decoupled_advantages` of each function's score,
    plus the episode's summed step rewards as one more component (weight 1) when any
    episode has them; ``scale_rewards`` does not apply.
    """
    groups = [group_key(t) for t in trajectories]
    statuses = [t.status for t in trajectories]
    started = [bool(t.turns) for t in trajectories]
    if reward_weights is None:
        rewards = [t.total_reward for t in trajectories]
        return group_advantages(rewards, groups, statuses, scale_rewards, late_policy, started)
    names, weights = list(reward_weights), list(reward_weights.values())
    rows = [[t.scores.get(name) for name in names] for t in trajectories]
    if any(any(t.step_rewards) for t in trajectories):
        rows = [[*row, sum(t.step_rewards)] for row, t in zip(rows, trajectories)]
        weights.append(1.0)
    return decoupled_advantages(rows, weights, groups, statuses, late_policy, started)

"""Samples: env/tool tokens carry no loss, per-turn fallback on rewritten history, collation."""

from __future__ import annotations

import math

import pytest

from agentgym import Trajectory, Turn
from agentgym._trajectory import PrefixMismatchError
from agentgym.trainers._samples import (
    Sample,
    build_samples,
    collate,
    episode_samples,
    micro_batches,
    rollout_mode_metrics,
    shared_prefix_length,
)
from tests.conftest import require

SYSTEM = [1, 2, 3]
TOOL_RESULT = [60, 61, 62]  # env tokens: the tool's answer wrapped in the template


def _turn(prompt: list[int], completion: list[int], mask: list[int] | None = None) -> Turn:
    logprobs = [-0.1 * (i + 1) for i in range(len(completion))]
    return Turn(prompt_ids=prompt, completion_ids=completion, logprobs=logprobs,
                completion_mask=mask)


def tool_episode() -> Trajectory:
    """Turn 0 calls a tool; turn 1's prompt is turn 0's tokens + the tool result."""
    first = _turn(SYSTEM, [10, 11, 12])
    second = _turn(SYSTEM + [10, 11, 12] + TOOL_RESULT, [20, 21])
    return Trajectory("calc", turns=[first, second], final_reward=1.0)


def rewritten_episode() -> Trajectory:
    """Turn 1's prompt drops part of turn 0's completion (like Qwen3 dropping <think>)."""
    first = _turn(SYSTEM, [10, 11, 12])
    second = _turn(SYSTEM + [12] + TOOL_RESULT, [20, 21])
    return Trajectory("calc", turns=[first, second], final_reward=0.0)


def test_concat_masks_exactly_the_env_and_prompt_tokens() -> None:
    [sample] = episode_samples(tool_episode(), 0.5, "concat")
    assert sample.input_ids == SYSTEM + [10, 11, 12] + TOOL_RESULT + [20, 21]
    trained = [tok for tok, m in zip(sample.input_ids, sample.loss_mask) if m]
    untrained = [tok for tok, m in zip(sample.input_ids, sample.loss_mask) if not m]
    assert trained == [10, 11, 12, 20, 21]
    assert untrained == SYSTEM + TOOL_RESULT
    # engine logprobs sit on the sampled tokens only
    assert [lp is not None for lp in sample.engine_logprobs] == [bool(m) for m in sample.loss_mask]
    assert sample.engine_logprobs[-2:] == pytest.approx([-0.1, -0.2])
    assert (sample.advantage, sample.turn) == (0.5, None)


def test_env_forced_completion_tokens_carry_no_loss() -> None:
    trajectory = Trajectory("calc", turns=[_turn(SYSTEM, [10, 99, 11], mask=[1, 0, 1])])
    for mode in ("concat", "per_turn"):
        [sample] = episode_samples(trajectory, 1.0, mode)
        assert sample.loss_mask == [0, 0, 0, 1, 0, 1]


def test_auto_falls_back_to_per_turn_on_rewritten_history() -> None:
    samples = episode_samples(rewritten_episode(), -1.0, "auto", episode=3)
    assert [s.turn for s in samples] == [0, 1]
    assert all(s.advantage == -1.0 and s.episode == 3 for s in samples)
    second = samples[1]
    assert second.input_ids == SYSTEM + [12] + TOOL_RESULT + [20, 21]
    assert second.loss_mask == [0] * 7 + [1, 1]
    with pytest.raises(PrefixMismatchError):
        episode_samples(rewritten_episode(), -1.0, "concat")


def test_auto_keeps_concat_when_the_prefix_holds() -> None:
    assert [s.turn for s in episode_samples(tool_episode(), 1.0, "auto")] == [None]
    assert [s.turn for s in episode_samples(tool_episode(), 1.0, "per_turn")] == [0, 1]


def test_build_samples_skips_dropped_episodes_and_reports_modes() -> None:
    samples = build_samples([tool_episode(), rewritten_episode(), tool_episode()],
                            [1.0, -1.0, None])
    assert [(s.episode, s.turn) for s in samples] == [(0, None), (1, 0), (1, 1)]
    metrics = rollout_mode_metrics(samples)
    assert metrics["rollout/per_turn_episodes"] == 1.0
    assert metrics["rollout/trained_tokens"] == 5 + 3 + 2
    with pytest.raises(ValueError, match="one advantage per trajectory"):
        build_samples([tool_episode()], [])


def test_turns_without_trained_tokens_are_left_out() -> None:
    trajectory = Trajectory("calc", turns=[_turn(SYSTEM, [10], mask=[0]), _turn([5], [6])])
    assert [s.turn for s in episode_samples(trajectory, 1.0, "per_turn")] == [1]


def test_missing_token_ids_are_an_error() -> None:
    with pytest.raises(ValueError, match="no token ids"):
        episode_samples(Trajectory("calc", turns=[Turn(text="hi")]), 1.0, "per_turn")


def test_collate_right_pads_with_neutral_values() -> None:
    require("torch")
    from agentgym.trainers._prefix import logits_to_keep

    samples = build_samples([tool_episode(), rewritten_episode()], [1.0, -1.0], "auto")
    batch = collate(samples, pad_token_id=0)
    width = len(samples[0].input_ids)
    assert batch.input_ids.shape == (3, width)
    short = len(samples[1].input_ids)
    assert batch.input_ids[1, short:].tolist() == [0] * (width - short)
    assert batch.attention_mask[1].tolist() == [1] * short + [0] * (width - short)
    assert batch.loss_mask[1].tolist() == [float(m) for m in samples[1].loss_mask] + [0.0] * (
        width - short)
    assert all(math.isnan(v) for v in batch.engine_logprobs[1, short:].tolist())
    assert math.isnan(batch.engine_logprobs[0, 0].item())
    assert batch.engine_logprobs[0, 3].item() == pytest.approx(-0.1)
    assert batch.advantages.tolist() == [1.0, -1.0, -1.0]
    assert batch.num_items == 5 + 3 + 2
    real = sum(len(s.input_ids) for s in samples)
    assert batch.pad_fraction == pytest.approx(1 - real / (3 * width))
    first_trained = min(s.loss_mask.index(1) for s in samples)
    keep = logits_to_keep(batch.loss_mask)
    assert keep == width - first_trained + 1  # from the position that predicts it
    with pytest.raises(ValueError, match="empty"):
        collate([])


def _sample(length: int) -> Sample:
    return Sample(list(range(length)), [1] * length, [None] * length, 1.0, episode=length)


def test_micro_batches_group_by_length_and_stay_under_the_token_cap() -> None:
    samples = [_sample(n) for n in (10, 3, 7, 5, 2, 9, 30)]
    lengths = [[len(s.input_ids) for s in group] for group in micro_batches(samples, parts=2)]
    assert lengths == [[2, 3, 5, 7], [9, 10, 30]]  # short rows no longer pad to 30
    capped = micro_batches(samples, max_tokens=20)
    # the fewest passes under the cap (a sample over it goes alone), then the least padding
    assert [[len(s.input_ids) for s in group] for group in capped] == [
        [2, 3], [5, 7], [9, 10], [30]
    ]
    for group in capped[:-1]:
        assert len(group) * max(len(s.input_ids) for s in group) <= 20
    assert sorted(s.episode for g in capped for s in g) == sorted(s.episode for s in samples)
    assert micro_batches(samples) == [sorted(samples, key=lambda s: len(s.input_ids))]
    assert micro_batches([], parts=2, max_tokens=20) == []  # a rank with no samples this step


def _widths(groups: list[list[Sample]]) -> list[tuple[int, int]]:
    return [(len(group), max(len(s.input_ids) for s in group)) for group in groups]


def test_micro_batches_give_a_long_episode_its_own_pass_when_that_is_less_work() -> None:
    """The shape of a calculator step: 715 prompt tokens, seven one-turn episodes, one of two."""
    step = [_sample(763) for _ in range(7)] + [_sample(1278)]
    # one pass: 715 + 8 x 563 = 5219 positions; two: 715 + 7 x 48 + 1278 and one more pass
    assert _widths(micro_batches(step, shared_prefix=715, pass_cost=128)) == [(7, 763), (1, 1278)]
    alike = [_sample(763) for _ in range(7)] + [_sample(780)]
    assert _widths(micro_batches(alike, shared_prefix=715, pass_cost=128)) == [(8, 780)]
    # without a shared prefix each row pays its whole width: 8 x 780 against 7 x 763 + 780 + 128
    assert _widths(micro_batches(alike, pass_cost=128)) == [(8, 780)]
    assert _widths(micro_batches(alike, pass_cost=64)) == [(7, 763), (1, 780)]
    # the cap still binds: six rows of 763 would be 4578 positions
    assert _widths(micro_batches(step, max_tokens=4000, shared_prefix=715, pass_cost=128)) == [
        (5, 763), (2, 763), (1, 1278)
    ]


def test_shared_prefix_length_is_what_every_sample_starts_with() -> None:
    def sample(ids: list[int]) -> Sample:
        return Sample(ids, [1] * len(ids), [None] * len(ids), 1.0, episode=0)

    assert shared_prefix_length([sample([1, 2, 3, 4]), sample([1, 2, 5]), sample([1, 2, 3])]) == 2
    assert shared_prefix_length([sample([1, 2]), sample([1, 2, 3])]) == 2  # one is the prefix
    assert shared_prefix_length([sample([9, 2]), sample([1, 2])]) == 0
    assert shared_prefix_length([sample([1, 2])]) == 0  # nothing to share with


def uneven_episode() -> Trajectory:
    """Three turns of 1, 4 and 2 sampled tokens; the prefix holds, so both modes apply."""
    first = _turn(SYSTEM, [10])
    second_prompt = SYSTEM + [10] + TOOL_RESULT
    second = _turn(second_prompt, [20, 21, 22, 23])
    third = _turn(second_prompt + [20, 21, 22, 23] + TOOL_RESULT, [30, 31])
    return Trajectory("calc", turns=[first, second, third], final_reward=1.0)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"])
def test_an_episode_weighs_the_same_trained_whole_or_turn_by_turn(loss_type: str) -> None:
    """Which mode an episode gets depends on the chat template (``auto``), not on what it did;
    counted as samples, its three turns weighed three times one episode played in one turn."""
    require("torch")
    import torch

    from agentgym.trainers._loss import LossSpec, grpo_loss

    high = 1.2 if loss_type == "cispo" else 0.2  # cispo's epsilon_high caps the ratio itself
    spec = LossSpec(epsilon_low=0.2, epsilon_high=high, loss_type=loss_type, length_norm=8)
    episodes = [uneven_episode(), tool_episode()]

    def loss_and_grad(mode: str) -> tuple[float, float]:
        batch = collate(build_samples(episodes, [1.0, -0.5], mode))
        theta = torch.tensor(1.0, requires_grad=True)
        ids = batch.input_ids.float()
        logps = -0.01 * ids * theta  # each token's logprob depends on the token, not its place
        old = -0.013 * ids  # ratios differ per token, so per-token losses do too
        out = grpo_loss(logps, batch.advantages, batch.loss_mask, spec, old_logps=old,
                        shares=batch.shares)  # fmt: skip
        out.loss.backward()
        assert theta.grad is not None
        return out.loss.item(), theta.grad.item()

    assert loss_and_grad("per_turn") == pytest.approx(loss_and_grad("concat"), rel=1e-6)


def test_the_shares_of_an_episodes_turns_are_its_token_fractions() -> None:
    samples = episode_samples(uneven_episode(), 1.0, "per_turn")
    assert [s.share for s in samples] == pytest.approx([1 / 7, 4 / 7, 2 / 7])
    assert [s.share for s in episode_samples(uneven_episode(), 1.0, "concat")] == [1.0]

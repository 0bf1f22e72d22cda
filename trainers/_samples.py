"""Trajectories + advantages -> training samples -> right-padded tensors.

Two ways to turn a multi-turn episode into token sequences, both without re-tokenizing:

- ``concat``: one sequence per episode, `Trajectory.flatten` (every turn's prompt must extend
  the previous prompt + completion). Env/tool tokens between turns get loss mask 0 and no
  engine logprob. One forward pass per episode.
- ``per_turn``: one sample per turn, ``prompt_ids + completion_ids`` with mask 1 only on the
  completion, each carrying the episode's advantage. Needed when the chat template rewrites
  history (e.g. Qwen3 drops earlier ``<think>`` blocks); costs O(turns^2) tokens.
- ``auto``: ``per_turn`` for each episode the engine played so (`Trajectory.mode`); the
  others ``concat`` where the prefix property holds, else ``per_turn``.

An episode weighs the same in the loss either way: each per-turn sample carries its
``share`` of the episode's trained tokens, which weights its per-sequence loss (``grpo``), and
the shares of an episode sum to 1 where sequences are counted (``grpo``, ``dr_grpo``). Counted
as samples, an episode of five turns would weigh five times one played in one turn, and
whether it did would depend on the chat template.

A sample with no mask-1 token (e.g. a turn of env-forced tokens only) is left out: it would
add nothing to the loss but still count as a sequence in its normaliser.

Building samples needs no torch; `collate` imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from agentgym._trajectory import PrefixMismatchError, Trajectory, Turn

from ._config import RolloutMode

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Sample:
    """One training sequence. ``loss_mask`` and ``engine_logprobs`` align with ``input_ids``."""

    input_ids: list[int]
    loss_mask: list[int]
    #: The engine's logprob of each token it sampled; None on prompt/env tokens or if missing.
    engine_logprobs: list[float | None]
    advantage: float
    #: Index of the episode in the list given to `build_samples`.
    episode: int
    #: The turn this sample holds (``per_turn``), or None for a whole episode (``concat``).
    turn: int | None = None
    #: Its part of the episode's trained tokens: 1.0 for a whole episode (see the module).
    share: float = 1.0

    @property
    def num_trained_tokens(self) -> int:
        """Tokens that carry loss."""
        return sum(self.loss_mask)


@dataclass
class Batch:
    """Right-padded ``(B, L)`` tensors of a list of samples, plus ``(B,)`` advantages and shares.

    Padding has ``attention_mask`` 0, ``loss_mask`` 0 and ``engine_logprobs`` NaN, as do
    tokens the engine gave no logprob for (NaN means "no IS correction" to `grpo_loss`).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    engine_logprobs: torch.Tensor
    advantages: torch.Tensor
    shares: torch.Tensor

    @property
    def num_items(self) -> int:
        """Trained (mask-1) tokens in the batch, the ``dapo`` normaliser."""
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on ``device``."""
        return Batch(*(t.to(device) for t in self._tensors()))

    @property
    def pad_fraction(self) -> float:
        """Share of the ``(B, L)`` positions that are padding (computed for nothing)."""
        return 1.0 - float(self.attention_mask.float().mean())

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.input_ids, self.attention_mask, self.loss_mask, self.engine_logprobs,
                self.advantages, self.shares)


def _turn_sample(turn: Turn, k: int, advantage: float, episode: int) -> Sample:
    """Turn ``k`` alone: its whole prompt (mask 0) then its completion."""
    if turn.prompt_ids is None or turn.completion_ids is None:
        raise ValueError(f"turn {k} has no token ids; use a backend that returns them")
    prompt, completion = turn.prompt_ids, turn.completion_ids
    engine: list[float | None] = [None] * len(prompt)
    engine += turn.logprobs or [None] * len(completion)
    return Sample(
        input_ids=prompt + completion,
        loss_mask=[0] * len(prompt) + (turn.completion_mask or [1] * len(completion)),
        engine_logprobs=engine,
        advantage=advantage,
        episode=episode,
        turn=k,
    )


def per_turn_samples(trajectory: Trajectory, advantage: float, episode: int = 0) -> list[Sample]:
    """One sample per turn, each with the episode's advantage and its token ``share``.

    Turns with no trained token are left out.

    Raises:
        ValueError: a turn has no token ids.
    """
    samples = [_turn_sample(t, k, advantage, episode) for k, t in enumerate(trajectory.turns)]
    kept = [s for s in samples if s.num_trained_tokens]
    total = sum(s.num_trained_tokens for s in kept)
    return [replace(s, share=s.num_trained_tokens / total) for s in kept]


def concat_sample(trajectory: Trajectory, advantage: float, episode: int = 0) -> Sample:
    """The whole episode as one sequence (`Trajectory.flatten`).

    Raises:
        PrefixMismatchError: the history was rewritten between turns; use `per_turn_samples`.
        ValueError: a turn has no token ids.
    """
    ids, mask, logprobs = trajectory.flatten()
    return Sample(ids, mask, logprobs, advantage, episode)


def episode_samples(
    trajectory: Trajectory, advantage: float, mode: RolloutMode, episode: int = 0
) -> list[Sample]:
    """The samples of one episode under ``mode`` (``auto`` falls back to per-turn).

    ``auto`` trains an episode the engine played ``per_turn`` (`Trajectory.mode`) per turn even
    where its prompts happen to extend each other (a one-turn episode): each sample is then
    the engine's own prompt and completion, and ``rollout/per_turn_episodes`` counts the
    episodes the run log said were played per turn.

    Raises:
        PrefixMismatchError: ``mode="concat"`` and the history was rewritten.
        ValueError: a turn has no token ids.
    """
    if mode == "per_turn" or (mode == "auto" and trajectory.mode == "per_turn"):
        return per_turn_samples(trajectory, advantage, episode)
    try:
        sample = concat_sample(trajectory, advantage, episode)
    except PrefixMismatchError:
        if mode == "concat":
            raise
        return per_turn_samples(trajectory, advantage, episode)
    return [sample] if sample.num_trained_tokens else []


def build_samples(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float | None],
    mode: RolloutMode = "auto",
) -> list[Sample]:
    """Samples of every episode with an advantage, in episode order.

    Episodes whose advantage is None (dropped: ``infra_error``, late) give none.

    Raises:
        ValueError: the two sequences differ in length, or a kept turn has no token ids.
        PrefixMismatchError: ``mode="concat"`` and an episode's history was rewritten.
    """
    if len(trajectories) != len(advantages):
        raise ValueError(
            f"one advantage per trajectory: got {len(trajectories)} trajectories and "
            f"{len(advantages)} advantages"
        )
    return [
        sample
        for i, (trajectory, advantage) in enumerate(zip(trajectories, advantages))
        if advantage is not None
        for sample in episode_samples(trajectory, advantage, mode, i)
    ]


#: What one more forward/backward pass costs, in token positions of work, by device type: the
#: price `micro_batches` weighs against padding. On the 2-core CPU machines this project is
#: built on, a pass of the tiny and the quickstart model costs 2.7-6 ms before its first token
#: and 0.035-0.09 ms a token, so 65-80 tokens; 128 leaves room. The CUDA figure is an estimate,
#: not a measurement: a 24-layer model's forward and backward launch some 20 ms of kernels, and
#: a 0.5B model's token costs about 7.5 us of a saturated H200's time. Other accelerators get
#: the CUDA figure.
PASS_COST_TOKENS = {"cpu": 128, "cuda": 4096}


def micro_batches(
    samples: Sequence[Sample],
    parts: int = 1,
    max_tokens: int | None = None,
    *,
    shared_prefix: int = 0,
    pass_cost: int | None = None,
) -> list[list[Sample]]:
    """``samples`` grouped into the forward/backward passes of one update, for the least work.

    Why: a pass pads its rows to its longest one, so a single multi-turn episode five times
    longer than the rest would make every row of the step five times longer. Samples are
    sorted by length; ``parts`` groups of near-equal row counts (`gradient_accumulation_steps`)
    are each cut where it saves work: a pass of k rows and width W costs
    ``shared_prefix + k * (W - shared_prefix)`` token positions (the trainer computes the
    rows' common prefix once) plus ``pass_cost`` for the pass itself (`PASS_COST_TOKENS`;
    None: as few passes as possible). Rows x width stays within ``max_tokens`` (a sample
    longer than that goes alone). The loss normalisers count the whole step, so how the
    samples are grouped does not change the update.
    """
    if not samples:  # a rank without samples still joins the gradient sum, with zeros
        return []
    ordered = sorted(samples, key=lambda sample: len(sample.input_ids))
    size = -(-len(ordered) // parts)  # ceil: at most ``parts`` groups
    return [
        batch
        for first in range(0, len(ordered), size)
        for batch in _cheapest_cuts(ordered[first : first + size], max_tokens, shared_prefix,
                                    pass_cost)
    ]  # fmt: skip


def _cheapest_cuts(
    rows: Sequence[Sample], max_tokens: int | None, shared_prefix: int, pass_cost: int | None
) -> list[list[Sample]]:
    """``rows`` (ascending lengths) cut into consecutive passes of least total cost.

    Dynamic programming over where the passes end: ``best[end]`` is the cheapest way to run
    ``rows[:end]``, its last pass starting at ``start[end]``. O(rows^2): 3 ms for 256 samples
    and 12 ms for 512 on a 2-core CPU machine, against seconds of forward and backward.
    """
    lengths = [len(row.input_ids) for row in rows]
    # None: a pass costs more than all padding could, so the fewest passes win, then less work
    per_pass = pass_cost if pass_cost is not None else len(rows) * lengths[-1] + 1
    best = [0] + [float("inf")] * len(rows)
    start = [0] * (len(rows) + 1)
    for end in range(1, len(rows) + 1):
        width = lengths[end - 1]
        for first in range(end - 1, -1, -1):
            count = end - first
            if count > 1 and max_tokens is not None and count * width > max_tokens:
                break  # starting earlier only widens the pass
            work = width if count == 1 else shared_prefix + count * (width - shared_prefix)
            if best[first] + per_pass + work < best[end]:
                best[end], start[end] = best[first] + per_pass + work, first
    cuts: list[list[Sample]] = []
    end = len(rows)
    while end:
        cuts.insert(0, list(rows[start[end] : end]))
        end = start[end]
    return cuts


def shared_prefix_length(samples: Sequence[Sample]) -> int:
    """Tokens every sample starts with: those of the lexicographically first and last.

    The samples' side of `_prefix.common_prefix_length`, which finds the prefix a pass shares
    on its padded rows; this one, before any padding, is what `micro_batches` weighs.
    """
    if len(samples) < 2:
        return 0
    first = min(sample.input_ids for sample in samples)
    last = max(sample.input_ids for sample in samples)
    differ = (k for k, (a, b) in enumerate(zip(first, last)) if a != b)
    return next(differ, min(len(first), len(last)))


def collate(samples: Sequence[Sample], pad_token_id: int = 0) -> Batch:
    """Right-pad ``samples`` into a `Batch` (length = the longest sample).

    Raises:
        ValueError: ``samples`` is empty.
    """
    import torch

    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    width = max(len(s.input_ids) for s in samples)

    def rows(values: Sequence[Sequence[float | int | None]], pad: float, dtype: torch.dtype
             ) -> torch.Tensor:
        padded = [[pad if v is None else v for v in row] + [pad] * (width - len(row))
                  for row in values]
        return torch.tensor(padded, dtype=dtype)

    nan = float("nan")
    return Batch(
        input_ids=rows([s.input_ids for s in samples], pad_token_id, torch.long),
        attention_mask=rows([[1] * len(s.input_ids) for s in samples], 0, torch.long),
        loss_mask=rows([s.loss_mask for s in samples], 0, torch.float32),
        engine_logprobs=rows([s.engine_logprobs for s in samples], nan, torch.float32),
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        shares=torch.tensor([s.share for s in samples], dtype=torch.float32),
    )


def rollout_mode_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """How episodes were turned into samples: ``rollout/per_turn_episodes`` and sample count."""
    per_turn = {s.episode for s in samples if s.turn is not None}
    return {
        "rollout/per_turn_episodes": float(len(per_turn)),
        "rollout/train_samples": float(len(samples)),
        "rollout/trained_tokens": float(sum(s.num_trained_tokens for s in samples)),
    }

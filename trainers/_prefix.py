"""The policy's logits for a batch whose rows share a prefix, computing the prefix once.

Why: a GRPO batch is G episodes of each task, and every episode starts with the same system
prompt and tool descriptions (715 of the calculator's ~760 tokens on the tiny tokenizer), so a
plain forward pass spends most of its work on B copies of one prefix. Here the longest prefix
common to every row runs once, its KV cache is repeated for the B rows, and only the suffixes
run on top. Attention over the cached keys is the same computation as over the recomputed
ones, so logits and gradients equal the plain pass's up to float rounding
(`tests/trainers/test_prefix.py`); gradients reach the prefix through the cache.

Rows are right-padded (`collate`), so every row's prefix sits at positions 0..n-1. The prefix
may reach past the prompt (G samples can begin with the same tokens); the logits asked for
there are computed too, so that costs nothing in exactness.
"""

from __future__ import annotations

from typing import Any

import torch

#: Below this many shared tokens the plain pass is used (a second call costs more than it saves).
MIN_SHARED_PREFIX = 32


def common_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """Tokens every row starts with, leaving each row at least one token of its own."""
    limit = int(attention_mask.sum(dim=1).min()) - 1
    if input_ids.shape[0] < 2 or limit <= 0:
        return 0
    same = (input_ids[:, :limit] == input_ids[:1, :limit]).all(dim=0)
    return int(same.long().cumprod(dim=0).sum())


def logits_to_keep(trained: torch.Tensor) -> int:
    """How many positions at the end of ``(B, L)`` rows have logits a loss reads.

    ``trained`` marks the tokens the loss covers (a loss mask, or labels != -100); the kept
    positions start at the one that predicts the first column any row trains on.
    """
    width = trained.shape[1]
    columns = trained.any(dim=0).nonzero()
    first = int(columns[0]) if len(columns) else width - 1
    return min(width, width - first + 1)


def policy_logits(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    share_prefix: bool = True,
    keep: int | None = None,
) -> torch.Tensor:
    """``(B, keep, V)`` logits of the last ``keep`` positions (None: all), the shared prefix once.

    Why ``keep``: the loss reads only the logits that predict trained tokens, and the rest are
    most of the step's memory with a real vocabulary (8 rows x 1,000 tokens x Qwen2.5's 151,936
    entries is 4.9 GB of float32); the model's ``logits_to_keep`` skips their projection.
    ``share_prefix=False`` runs the plain pass (gradient checkpointing disables the cache).
    """
    rows, width = input_ids.shape
    keep = width if keep is None else keep
    shared = common_prefix_length(input_ids, attention_mask) if share_prefix else 0
    if shared < MIN_SHARED_PREFIX:
        return model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits
    in_prefix = keep - (width - shared)  # kept positions that fall in the prefix
    prefix = model(input_ids=input_ids[:1, :shared], use_cache=True,
                   logits_to_keep=max(in_prefix, 1))  # fmt: skip
    cache = prefix.past_key_values
    cache.batch_repeat_interleave(rows)
    positions = torch.arange(shared, width, device=input_ids.device).expand(rows, -1)
    rest = model(
        input_ids=input_ids[:, shared:], attention_mask=attention_mask,
        past_key_values=cache, position_ids=positions, logits_to_keep=min(keep, width - shared),
    ).logits  # fmt: skip
    if in_prefix <= 0:
        return rest
    # kept prefix logits are every row's (a prefix may reach into trained tokens: G samples
    # can begin alike), a view until the concatenation
    return torch.cat([prefix.logits.expand(rows, -1, -1), rest], dim=1)

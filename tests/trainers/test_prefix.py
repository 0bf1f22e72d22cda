"""The shared-prefix pass and kept logits give the plain pass's logits and gradients (tiny LoRA)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import require


def batch(shared: int, lengths: list[int]):
    """Right-padded rows that share their first ``shared`` tokens, then differ."""
    import torch

    generator = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, 250, (shared,), generator=generator)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        own = torch.randint(3, 250, (length - shared,), generator=generator)
        ids[row, :length] = torch.cat([prefix, own])
        mask[row, :length] = 1
    return ids, mask


def masked_logprob_sum(logits, ids, mask):
    from agentgym.trainers._loss import token_logprobs

    return (token_logprobs(logits, ids) * mask).sum()


def test_shared_prefix_logits_and_gradients_equal_the_plain_pass(tiny_model_dir: Path) -> None:
    torch = require("torch")
    require("peft")
    from agentgym.engine.tiny import random_lora_model
    from agentgym.trainers._prefix import common_prefix_length, policy_logits

    model = random_lora_model(tiny_model_dir, rank=8)
    ids, mask = batch(shared=48, lengths=[60, 71, 55, 64])
    ids[1, 48] = ids[0, 48]  # two rows agree one token further: the common prefix is still 48
    assert common_prefix_length(ids, mask) == 48
    trainable = [p for p in model.parameters() if p.requires_grad]

    def run(forward):
        model.zero_grad()
        logits = forward(model, ids, mask)
        masked_logprob_sum(logits, ids, mask).backward()
        return logits.detach(), [p.grad.clone() for p in trainable]

    plain_logits, plain_grads = run(lambda m, i, a: m(input_ids=i, attention_mask=a).logits)
    shared_logits, shared_grads = run(policy_logits)
    real = mask.bool()
    assert torch.allclose(shared_logits[real], plain_logits[real], atol=1e-5)
    for shared, plain in zip(shared_grads, plain_grads):  # gradients reach the prefix too
        assert torch.allclose(shared, plain, atol=1e-5, rtol=1e-4)
    assert max(float(g.abs().max()) for g in shared_grads) > 0


def test_kept_logits_are_the_plain_pass_last_ones_with_or_without_the_shared_prefix(
    tiny_model_dir: Path,
) -> None:
    """``keep`` within the rows' own tokens, reaching into the shared prefix, and all of them."""
    torch = require("torch")
    require("peft")
    from agentgym.engine.tiny import random_lora_model
    from agentgym.trainers._prefix import policy_logits

    model = random_lora_model(tiny_model_dir, rank=8)
    ids, mask = batch(shared=48, lengths=[60, 71, 55, 64])
    trained = mask.clone()
    trained[:, :50] = 0  # loss from token 50 on: logits from position 49, the last 22 of 71
    trainable = [p for p in model.parameters() if p.requires_grad]

    def run(share: bool, keep: int | None):
        model.zero_grad()
        logits = policy_logits(model, ids, mask, share, keep)
        masked_logprob_sum(logits, ids, trained).backward()
        return logits.detach(), [p.grad.clone() for p in trainable]

    plain_logits, plain_grads = run(False, None)
    for share in (True, False):
        for keep in (22, 30, 71):  # 30 and 71 reach into the 48 shared tokens
            logits, grads = run(share, keep)
            assert logits.shape == (4, keep, plain_logits.shape[-1])
            real = mask[:, -keep:].bool()
            assert torch.allclose(logits[real], plain_logits[:, -keep:][real], atol=1e-5)
            for kept, plain in zip(grads, plain_grads):
                assert torch.allclose(kept, plain, atol=1e-5, rtol=1e-4), (share, keep)


def test_short_or_single_row_prefixes_use_the_plain_pass(tiny_model_dir: Path) -> None:
    require("torch")
    from agentgym.trainers._prefix import MIN_SHARED_PREFIX, common_prefix_length

    ids, mask = batch(shared=MIN_SHARED_PREFIX - 1, lengths=[40, 50])
    assert common_prefix_length(ids, mask) == MIN_SHARED_PREFIX - 1
    ids, mask = batch(shared=30, lengths=[30, 50])  # a row that is all prefix keeps a token
    assert common_prefix_length(ids, mask) == 29
    assert common_prefix_length(ids[:1], mask[:1]) == 0


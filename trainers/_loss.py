"""The GRPO policy loss and its pieces, as small pure functions on ``(batch, seq)`` tensors.

Conventions shared by every function here:

- Per-token tensors are aligned with ``input_ids``: position ``t`` holds the value for token
  ``t`` (its log-probability given tokens ``< t``). Position 0 has no prediction and holds 0.
- ``mask`` is the loss mask: 1 on tokens the policy sampled and is trained on, 0 on prompt,
  env/tool and padding tokens. Nothing outside the mask reaches the loss or the metrics.
- Log-probabilities are natural-log, at the sampling temperature (logits / temperature), the
  same quantity vLLM reports with ``--logprobs-mode processed_logprobs``.

The maths follows TRL 1.16's ``GRPOTrainer._compute_loss`` (agreement is tested in
``tests/trainers/test_loss.py``): clipped ratios ``min(r * A, clip(r, 1 - eps, 1 + eps_high) * A)``
at token or sequence (GSPO) level; the engine-mismatch correction in TRL's four
``vllm_importance_sampling_mode`` s (``token_truncate`` by default: weight
``min(exp(old - engine), cap)`` per token, multiplying the policy term only); the k3 KL with
TRL's default ``use_bias_correction_kl=True`` (KL times the policy ratio).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from ._config import GRPOConfig, ImportanceSamplingLevel, ImportanceSamplingMode, LossType


@dataclass(frozen=True)
class LossSpec:
    """The loss knobs of a run, resolved (no None left)."""

    loss_type: LossType = "dapo"
    importance_sampling_level: ImportanceSamplingLevel = "token"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    #: KL coefficient; 0 skips the KL term (``ref_logps`` are then not needed).
    beta: float = 0.0
    #: Whether engine logprobs, when given, weight the loss (IS, bounded by `is_mode`).
    is_correction: bool = True
    is_mode: ImportanceSamplingMode = "token_truncate"
    #: Bounds of the IS ratio (None: unbounded on that side).
    is_cap: float | None = 3.0
    is_floor: float | None = None
    #: Dr. GRPO's constant: ``dr_grpo`` divides the token sum by ``num_sequences * length_norm``.
    length_norm: int = 1
    #: Share of trained tokens, the highest-entropy ones, the policy term keeps (1.0: all).
    top_entropy_quantile: float = 1.0
    #: Two-sided clipping (INTELLECT-2): the unclipped ratio is capped at ``delta``; None: off.
    delta: float | None = None
    #: Multiply the k3 KL by the policy ratio (TRL's default bias correction).
    kl_bias_correction: bool = True
    #: Drop negative-advantage samples whose mean sampling-to-policy KL exceeds it; None: off.
    off_policy_mask_threshold: float | None = None
    #: Weight of the mean-entropy bonus subtracted from the loss; 0: none.
    entropy_coef: float = 0.0
    #: ``sapo``'s gate temperatures for positive and other advantages.
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    #: ``vespo``'s gamma weight exponents and decays, for non-negative and negative advantages.
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0

    @classmethod
    def from_config(cls, config: GRPOConfig, max_turns: int | None = None) -> LossSpec:
        """The spec of ``config``; ``max_turns`` is the env's limit when the config has none.

        ``length_norm`` is the most policy tokens one episode can hold
        (``max_completion_length * turns``), the constant Dr. GRPO needs for multi-turn samples.
        """
        turns = config.max_turns or max_turns or 1
        derived: dict[str, Any] = {
            "epsilon_low": config.epsilon,
            "epsilon_high": config.epsilon if config.epsilon_high is None else config.epsilon_high,
            "is_correction": config.vllm_importance_sampling_correction,
            "is_mode": config.vllm_importance_sampling_mode,
            "is_cap": config.vllm_importance_sampling_clip_max,
            "is_floor": config.vllm_importance_sampling_clip_min,
            "kl_bias_correction": config.use_bias_correction_kl,
            "length_norm": config.max_completion_length * turns,
        }
        # every other field is the config's knob of the same name (loss_type, beta, delta, ...)
        names = [f.name for f in dataclasses.fields(cls) if f.name not in derived]
        same_name: dict[str, Any] = {name: getattr(config, name) for name in names}
        return cls(**same_name, **derived)


@dataclass(frozen=True)
class LossOutput:
    """The scalar loss to backpropagate, and detached float metrics for logging."""

    loss: torch.Tensor
    metrics: dict[str, float]
    #: Entropy summed over the tokens the policy term trained, and their count (0, 0 without
    #: entropies): what adaptive entropy control (`EntropyControl`) reads over a whole step.
    trained_entropy: tuple[float, float] = (0.0, 0.0)


# --- log-probabilities and entropy ------------------------------------------------------------


def _shifted_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Float32 logits that predict the next token, divided by ``temperature`` (last one dropped)."""
    return logits[:, :-1].float() / temperature


def _pad_front(values: torch.Tensor, width: int) -> torch.Tensor:
    """Zeros in front of ``values`` (the last positions' values) up to ``width`` columns."""
    return torch.nn.functional.pad(values, (width - values.shape[1], 0), value=0.0)


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probability of each token of ``input_ids`` under ``logits / temperature``.

    Args:
        logits: ``(B, K, V)`` model outputs for the last K positions of ``input_ids``
            (K = L: all of them; the trainer keeps only those that predict trained tokens).
        input_ids: ``(B, L)`` token ids.
        temperature: the sampling temperature (> 0).

    Returns:
        ``(B, L)`` float32, aligned with ``input_ids``; the first ``L - K + 1`` columns are 0.
    """
    shifted = _shifted_logits(logits, temperature)
    predicted = input_ids[:, input_ids.shape[1] - shifted.shape[1] :]
    chosen = shifted.gather(-1, predicted.unsqueeze(-1)).squeeze(-1)
    return _pad_front(chosen - torch.logsumexp(shifted, dim=-1), input_ids.shape[1])


def token_entropy(
    logits: torch.Tensor, temperature: float = 1.0, width: int | None = None
) -> torch.Tensor:
    """Entropy (nats) of the distribution each token was drawn from, aligned like `token_logprobs`.

    ``logits`` are those of the last positions of rows ``width`` tokens long (None: all).

    Returns:
        ``(B, width)`` float32; the columns without logits are 0.
    """
    logp = torch.log_softmax(_shifted_logits(logits, temperature), dim=-1)
    return _pad_front(-(logp.exp() * logp).sum(-1), width or logits.shape[1])


# --- ratios, weights, KL ------------------------------------------------------------------------


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over mask-1 entries (0 when the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def log_policy_ratio(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    mask: torch.Tensor,
    level: ImportanceSamplingLevel,
) -> torch.Tensor:
    """Log importance ratio of the current policy to the one that sampled.

    ``token``: ``(B, T)``, one per token. ``sequence`` (GSPO): ``(B, 1)``, the mean per-token
    log-ratio over each sequence's mask-1 tokens.
    """
    log_ratio = logps - old_logps
    if level == "token":
        return log_ratio
    per_sequence = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_sequence.unsqueeze(-1)


def importance_weights(
    old_logps: torch.Tensor,
    engine_logps: torch.Tensor,
    mask: torch.Tensor,
    cap: float | None,
    *,
    floor: float | None = None,
    mode: ImportanceSamplingMode = "token_truncate",
) -> torch.Tensor:
    """IS ratios ``exp(old - engine)`` correcting engine drift, bounded to ``[floor, cap]``.

    ``token_*`` modes give one ratio per token, ``sequence_*`` one per row (its tokens'
    log-ratios summed, shape ``(B, 1)``); ``*_truncate`` clips ratios to the bounds and
    ``*_mask`` sets those outside them to 0 (TRL's four modes). ``engine_logps`` may hold NaN
    where the engine gave no logprob; those tokens, and tokens outside ``mask``, add log-ratio
    0. No gradient flows through the ratios.
    """
    diff = torch.nan_to_num((old_logps.detach() - engine_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    low = -math.inf if floor is None else floor
    high = math.inf if cap is None else cap
    if mode.endswith("truncate"):
        return ratio.clamp(min=low, max=high)
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, share: float) -> torch.Tensor:
    """1 on the mask-1 tokens whose entropy is at least the ``1 - share`` quantile of them.

    Why: most tokens of a reasoning trace are near-certain; the few "forking" tokens of high
    entropy carry the learning signal (Wang et al. 2025, "Beyond the 80/20 Rule"). The
    quantile interpolates linearly, as TRL's ``get_high_entropy_mask``; ``share`` 0 keeps the
    highest-entropy token(s) only.
    """
    trained = entropies[mask.bool()].float()
    if trained.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(trained, 1.0 - share)
    return ((entropies >= threshold) & mask.bool()).to(mask.dtype)


def kl_k3(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): ``exp(d) - d - 1``, ``d = ref - logp``."""
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


def clipped_objective(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> torch.Tensor:
    """Per-token PPO-clip loss ``-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)``.

    ``advantages`` is ``(B, 1)`` and broadcasts over ``ratio`` (``(B, T)`` or ``(B, 1)``).
    ``delta`` caps the unclipped ``r`` too (two-sided clipping, INTELLECT-2): a negative
    advantage then cannot push a ratio that grew far above 1 any further.
    """
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    return -torch.min(unclipped * advantages, clipped * advantages)


def policy_objective(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    logps: torch.Tensor,
    spec: LossSpec,
    *,
    old_logps: torch.Tensor,
    mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token policy loss of ``spec.loss_type``, before masks, IS weights and the KL.

    - ``grpo``, ``dr_grpo``, ``dapo``, ``luspo``: the PPO clip (`clipped_objective`).
    - ``cispo`` (MiniMax-M1): ``-sg(min(r, epsilon_high)) * A * logp``; the clipped ratio is a
      constant weight, so every token keeps its gradient (the PPO clip zeroes it).
    - ``sapo``: ``-sigmoid(tau * (r - 1)) * 4 / tau * A``, a smooth gate in place of the clip,
      ``tau`` by the advantage's sign.
    - ``vespo``: ``-sg(phi(w)) * A * logp`` with `vespo_weights` (``is_weights`` fold into w).
    """
    if spec.loss_type == "cispo":
        return -torch.clamp(ratio, max=spec.epsilon_high).detach() * advantages * logps
    if spec.loss_type == "sapo":
        tau = torch.where(advantages > 0, spec.sapo_temperature_pos, spec.sapo_temperature_neg)
        return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * advantages
    if spec.loss_type == "vespo":
        phi = vespo_weights(advantages, logps.detach() - old_logps, mask, is_weights, spec)
        return -phi * advantages * logps
    return clipped_objective(ratio, advantages, spec.epsilon_low, spec.epsilon_high, spec.delta)


def vespo_weights(
    advantages: torch.Tensor,
    token_log_ratio: torch.Tensor,
    mask: torch.Tensor,
    is_weights: torch.Tensor | None,
    spec: LossSpec,
) -> torch.Tensor:
    """``(B, 1)`` VESPO's weight ``phi(w) = exp(lam + k log w - lam w)`` of each row's ratio w.

    ``w`` is the row's sequence ratio (its trained tokens' ``policy / old`` ratios multiplied,
    and the engine correction ``is_weights`` with them), so ``phi(1) = 1`` and ``phi`` falls
    smoothly on both sides instead of a hard clip; ``k`` and ``lam`` by the advantage's sign.
    Logs are clamped to [log 1e-8, 20] as in the VESPO reference and TRL. No gradient.
    """
    floor = math.log(1e-8)
    log_w = (token_log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True)
    if is_weights is not None:
        # over the trained tokens only: a bound other than 1 (clip_max < 1, clip_min > 1)
        # also moves the prompt's ratios of 1, which zeroed the weight of long prompts
        log_w = log_w + (torch.log(is_weights).clamp(floor, 20.0) * mask).sum(-1, keepdim=True)
    log_w = log_w.clamp(floor, 20.0)
    positive = advantages >= 0
    k = torch.where(positive, spec.vespo_k_pos, spec.vespo_k_neg)
    lam = torch.where(positive, spec.vespo_lambda_pos, spec.vespo_lambda_neg).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).detach()


def off_policy_sequence_mask(
    advantages: torch.Tensor,
    logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """``(B, 1)``: 0 for rows with a negative advantage whose policy drifted off the sampler.

    DeepSeek-V3.2's off-policy sequence masking (TRL's ``off_policy_mask_threshold``): a
    row's mean of ``sampling - policy`` log-probabilities over its trained tokens estimates
    KL(sampler || policy); a negative-advantage row above ``threshold`` is dropped, since
    pushing down tokens the policy no longer samples mostly adds noise. Tokens without a
    sampling log-prob (NaN) add 0.
    """
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0) * mask
    mean_kl = kl.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (mean_kl <= threshold)).to(mask.dtype)


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    spec: LossSpec,
    *,
    num_sequences: float | None = None,
    num_items: float | None = None,
    shares: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to a scalar the way ``spec.loss_type`` says.

    For gradient accumulation pass the totals of the whole optimiser step: ``num_sequences``
    (episodes: the sum of the samples' ``shares``) and ``num_items`` (mask-1 tokens); each
    micro-batch's loss then sums to the step's loss. None: this batch's own count.
    ``shares``: ``(B,)`` each row's part of its episode's trained tokens (a per-turn sample's;
    1 for a whole episode, and None: all 1), so an episode weighs the same in either mode.

    - ``grpo``, ``sapo``: per-sequence token mean weighted by its share, summed /
      ``num_sequences``.
    - ``dr_grpo``: token sum / (``num_sequences * spec.length_norm``).
    - ``luspo``: token sum / ``num_sequences`` (each sequence's sum, averaged over episodes).
    - ``dapo``, ``cispo``, ``vespo``: token sum / ``num_items``.
    """
    if num_sequences is not None:
        sequences = num_sequences
    else:
        sequences = float(per_token_loss.size(0)) if shares is None else float(shares.sum())
    token_sum = per_token_loss * mask
    if spec.loss_type in ("grpo", "sapo"):
        per_sequence = token_sum.sum(-1) / mask.sum(-1).clamp(min=1.0)
        if shares is not None:
            per_sequence = per_sequence * shares
        return per_sequence.sum() / sequences
    if spec.loss_type == "dr_grpo":
        return token_sum.sum() / (sequences * spec.length_norm)
    if spec.loss_type == "luspo":
        return token_sum.sum() / sequences
    items = mask.sum().clamp(min=1.0) if num_items is None else max(num_items, 1.0)
    return token_sum.sum() / items


# --- the loss -----------------------------------------------------------------------------------


def grpo_loss(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    spec: LossSpec,
    *,
    old_logps: torch.Tensor | None = None,
    engine_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    num_sequences: float | None = None,
    num_items: float | None = None,
    shares: torch.Tensor | None = None,
) -> LossOutput:
    """The GRPO/DAPO/Dr. GRPO/GSPO loss of one (micro-)batch, with its metrics.

    Args:
        logps: ``(B, T)`` current policy log-probs, with gradient (`token_logprobs`).
        advantages: ``(B,)`` one advantage per sample.
        mask: ``(B, T)`` loss mask (1 = trained token).
        spec: the loss knobs.
        old_logps: ``(B, T)`` log-probs of the policy that sampled, as the trainer computes
            them. None: ``logps.detach()`` (on-policy, a single update per batch).
        engine_logps: ``(B, T)`` the engine's logprobs of the sampled tokens (NaN where
            missing). When given and ``spec.is_correction``, the loss is IS-corrected.
        ref_logps: ``(B, T)`` reference (adapter-disabled) log-probs; needed iff ``spec.beta``.
        entropies: ``(B, T)`` per-token entropies (`token_entropy`): for the metric; with
            ``spec.top_entropy_quantile`` below 1, to choose the tokens the policy term keeps;
            with ``spec.entropy_coef``, carrying gradient, for the entropy bonus (the mean over
            the tokens the policy term trains, weighted by this batch's part of ``num_items``).
        num_sequences: episodes in the whole optimiser step, for accumulation (`aggregate`).
        num_items: mask-1 tokens in the whole optimiser step, for accumulation (`aggregate`).
        shares: ``(B,)`` each sample's part of its episode's trained tokens (`aggregate`).

    Returns:
        The loss and metrics: ``loss/*`` (clip ratios, kl, entropy) and ``sampling/*`` (IS
        weight min/mean/max, logprob drift |trainer - engine| mean/max), means over mask-1
        tokens.
    """
    mask = mask.to(logps.dtype)
    old = logps.detach() if old_logps is None else old_logps
    adv = advantages.reshape(-1, 1).to(logps.dtype)
    log_ratio = log_policy_ratio(logps, old, mask, spec.importance_sampling_level)
    ratio = torch.exp(log_ratio)
    metrics = _clip_metrics(ratio, adv, mask, spec)
    weights = None
    if engine_logps is not None and spec.is_correction:
        weights = importance_weights(old, engine_logps, mask, spec.is_cap, floor=spec.is_floor,
                                     mode=spec.is_mode).expand_as(mask)  # fmt: skip
        metrics.update(_sampling_metrics(old, engine_logps, weights, mask))
        if spec.is_mode.endswith("mask"):
            metrics["sampling/is_masked_share"] = masked_mean((weights == 0).to(mask.dtype),
                                                              mask).item()  # fmt: skip
    per_token = policy_objective(ratio, adv, logps, spec, old_logps=old, mask=mask,
                                 is_weights=weights)  # fmt: skip
    if weights is not None and spec.loss_type != "vespo":  # vespo folds them into its weight
        per_token = per_token * weights
    if spec.off_policy_mask_threshold is not None:
        sampled = old if engine_logps is None else engine_logps
        kept_rows = off_policy_sequence_mask(adv, logps, sampled, mask,
                                             spec.off_policy_mask_threshold)  # fmt: skip
        per_token = per_token * kept_rows
        metrics["loss/off_policy_masked_share"] = 1.0 - kept_rows.mean().item()
    if spec.top_entropy_quantile < 1.0:
        if entropies is None:
            raise ValueError("top_entropy_quantile < 1 needs entropies (`token_entropy`)")
        kept = high_entropy_mask(entropies.detach(), mask, spec.top_entropy_quantile)
        per_token = per_token * kept
        metrics["loss/high_entropy_share"] = masked_mean(kept, mask).item()
    else:
        kept = mask
    if spec.beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs ref_logps (the adapter-disabled log-probs)")
        kl = kl_k3(logps, ref_logps)
        per_token = per_token + spec.beta * (kl * ratio if spec.kl_bias_correction else kl)
        metrics["loss/kl"] = masked_mean(kl, mask).item()
    trained = kept * mask  # the tokens the policy term trains
    trained_entropy = (0.0, 0.0)
    if entropies is not None:
        metrics["loss/entropy"] = masked_mean(entropies.detach(), mask).item()
        trained_entropy = ((entropies.detach() * trained).sum().item(), trained.sum().item())
    loss = aggregate(per_token, mask, spec, num_sequences=num_sequences, num_items=num_items,
                     shares=shares)
    if spec.entropy_coef:
        if entropies is None or not entropies.requires_grad:
            raise ValueError("entropy_coef needs entropies with gradient (`token_entropy`)")
        mean = (entropies * trained).sum() / trained.sum().clamp(min=1.0)
        # this pass's mean, weighted by its part of the step's trained tokens
        part = 1.0 if num_items is None else float(mask.sum()) / max(num_items, 1.0)
        loss = loss - spec.entropy_coef * mean * part
    metrics["loss/value"] = loss.item()
    return LossOutput(loss, metrics, trained_entropy)


def _clip_metrics(
    ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, spec: LossSpec
) -> dict[str, float]:
    """Fractions of trained tokens (or sequences, for GSPO) whose ratio was clipped.

    ``cispo`` clips only its weight's top (at ``epsilon_high`` itself); ``sapo`` and ``vespo``
    clip nothing.
    """
    low = ((ratio < 1 - spec.epsilon_low) & (adv < 0)).to(mask.dtype)
    high = ((ratio > 1 + spec.epsilon_high) & (adv > 0)).to(mask.dtype)
    if spec.loss_type == "cispo":
        low, high = torch.zeros_like(low), ((ratio > spec.epsilon_high) & (adv > 0)).to(mask.dtype)
    elif spec.loss_type in ("sapo", "vespo"):
        low = high = torch.zeros_like(low)
    weight = mask if ratio.size(-1) == mask.size(-1) else (mask.sum(-1, keepdim=True) > 0)
    weight = weight.to(mask.dtype)
    return {
        "loss/clip_ratio_low": masked_mean(low, weight).item(),
        "loss/clip_ratio_high": masked_mean(high, weight).item(),
        "loss/clip_ratio_region": masked_mean(torch.maximum(low, high), weight).item(),
    }


def _sampling_metrics(
    old: torch.Tensor, engine: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """IS weight and |trainer - engine| logprob drift statistics over scored mask-1 tokens."""
    scored = mask.bool() & ~torch.isnan(engine)
    if not scored.any():
        return {}
    drift = (old.detach() - engine).abs()[scored]
    w = weights[scored]
    return {
        "sampling/is_ratio_min": w.min().item(),
        "sampling/is_ratio_mean": w.mean().item(),
        "sampling/is_ratio_max": w.max().item(),
        "sampling/logprob_drift_mean": drift.mean().item(),
        "sampling/logprob_drift_max": drift.max().item(),
    }

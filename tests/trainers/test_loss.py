"""The GRPO loss: pieces on hand-made tensors, then agreement with TRL 1.16 on the same batch.

The agreement test builds a real `trl.GRPOTrainer` on the tiny Qwen2 model and calls its
``_compute_loss(model, inputs)`` with a hand-built batch (prompt/completion ids, masks with an
env-token span, advantages, perturbed old logprobs, reference logprobs, IS weights); our
`grpo_loss` gets the same batch through `token_logprobs` on the same model. Loss values and
the gradients they induce on every weight must agree (float32, tolerances below).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.conftest import require

#: float32 on both sides; TRL's fused LM head sums in tiles, so allow rounding differences.
#: Measured on the tiny model: |loss diff| <= 3e-8, |grad diff| <= 2e-7 over all 24 cases.
LOSS_RTOL, LOSS_ATOL = 1e-6, 1e-7
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def lm() -> ModuleType:
    """`agentgym.trainers._loss`, once torch is known to be importable."""
    require("torch")
    return importlib.import_module("agentgym.trainers._loss")


def spec(lm: ModuleType, **knobs: Any) -> Any:
    return lm.LossSpec(**{"epsilon_low": 0.2, "epsilon_high": 0.2, **knobs})


# --- pieces ------------------------------------------------------------------------------------


def test_token_logprobs_align_with_input_ids_and_use_temperature(lm: ModuleType) -> None:
    torch = lm.torch
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    ids = torch.tensor([[2, 0, 1]])
    logps = lm.token_logprobs(logits, ids, temperature=0.5)
    expected_1 = 4.0 - math.log(math.exp(4.0) + 2)  # id 0 under logits[0] / 0.5
    expected_2 = 2.0 - math.log(math.exp(2.0) + 2)  # id 1 under logits[1] / 0.5
    assert logps.tolist()[0] == pytest.approx([0.0, expected_1, expected_2], abs=1e-6)
    entropy = lm.token_entropy(logits, temperature=1.0)
    p = torch.softmax(logits[0, 1], -1)
    assert entropy[0, 2].item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-6)
    assert entropy[0, 0].item() == 0.0


def test_logits_of_the_last_positions_give_the_same_values_there_and_zeros_before(
    lm: ModuleType,
) -> None:
    torch = lm.torch
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 5, generator=generator)
    ids = torch.randint(0, 5, (2, 6), generator=generator)
    whole = lm.token_logprobs(logits, ids, temperature=0.7)
    entropy = lm.token_entropy(logits, temperature=0.7)
    for keep in (1, 2, 4, 6):
        last = lm.token_logprobs(logits[:, -keep:], ids, temperature=0.7)
        assert last.shape == (2, 6)
        valued = 6 - keep + 1  # the first column the kept logits predict
        assert torch.equal(last[:, valued:], whole[:, valued:])
        assert not last[:, :valued].any()
        kept_entropy = lm.token_entropy(logits[:, -keep:], temperature=0.7, width=6)
        assert torch.equal(kept_entropy[:, valued:], entropy[:, valued:])
        assert not kept_entropy[:, :valued].any()


def test_importance_weights_truncate_and_ignore_unscored_tokens(lm: ModuleType) -> None:
    torch = lm.torch
    old = torch.tensor([[0.0, -1.0, -1.0, -2.0, -1.0]])
    engine = torch.tensor([[float("nan"), -1.5, -3.0, float("nan"), -0.5]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]])
    weights = lm.importance_weights(old, engine, mask, cap=3.0)
    assert weights.tolist()[0] == pytest.approx([1.0, math.exp(0.5), 3.0, 1.0, 1.0])


@pytest.mark.parametrize(
    ("mode", "cap", "floor", "expected"),
    [
        ("token_truncate", 3.0, None, [[3.0, 0.5, 1.0], [1.5, 1.0, 2.0]]),
        ("token_truncate", 3.0, 0.6, [[3.0, 0.6, 1.0], [1.5, 1.0, 2.0]]),
        ("token_mask", 3.0, 0.6, [[0.0, 0.0, 1.0], [1.5, 1.0, 2.0]]),
        ("token_mask", None, 0.6, [[4.0, 0.0, 1.0], [1.5, 1.0, 2.0]]),
        ("sequence_truncate", 2.5, None, [[2.0], [2.5]]),  # exp(log 4 + log 0.5), exp(log 3)
        ("sequence_mask", 2.5, None, [[2.0], [0.0]]),
        ("sequence_mask", None, 2.5, [[0.0], [3.0]]),
    ],
)
def test_importance_sampling_modes_bound_token_or_sequence_ratios(
    lm: ModuleType, mode: str, cap: float | None, floor: float | None, expected: list
) -> None:
    """TRL's four modes; an unscored (NaN) or untrained token adds log-ratio 0."""
    torch = lm.torch
    old = torch.log(torch.tensor([[4.0, 0.5, 9.0], [1.5, 7.0, 2.0]]))
    engine = torch.tensor([[0.0, 0.0, 0.0], [0.0, float("nan"), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    weights = lm.importance_weights(old, engine, mask, cap, floor=floor, mode=mode)
    assert weights.shape == (2, len(expected[0]))
    assert weights.flatten().tolist() == pytest.approx(sum(expected, []))


def test_sequence_level_ratio_is_the_masked_mean_log_ratio(lm: ModuleType) -> None:
    torch = lm.torch
    logps = torch.tensor([[-1.0, -1.0, -5.0]])
    old = torch.tensor([[-1.2, -1.6, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    log_ratio = lm.log_policy_ratio(logps, old, mask, "sequence")
    assert log_ratio.shape == (1, 1)
    assert log_ratio.item() == pytest.approx(0.4)


def test_clipping_bounds_and_metrics(lm: ModuleType) -> None:
    torch = lm.torch
    # ratios 1.5, 0.5, 1.0: a high ratio is clipped only for A > 0, a low one only for A < 0
    logps = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    old = torch.zeros(1, 3)
    s = spec(lm, loss_type="dapo", epsilon_high=0.28)
    ratio = torch.exp(logps - old)
    positive = lm.clipped_objective(ratio, torch.tensor([[1.0]]), 0.2, 0.28)
    negative = lm.clipped_objective(ratio, torch.tensor([[-1.0]]), 0.2, 0.28)
    assert positive.tolist()[0] == pytest.approx([-1.28, -0.5, -1.0])
    assert negative.tolist()[0] == pytest.approx([1.5, 0.8, 1.0])
    # per-token advantages of mixed sign through the full loss: one high, one low clip
    out = lm.grpo_loss(logps[:, :2].repeat(2, 1), torch.tensor([1.0, -1.0]),
                       torch.tensor([[1.0, 0.0], [0.0, 1.0]]), s, old_logps=old[:, :2].repeat(2, 1))
    assert out.metrics["loss/clip_ratio_high"] == pytest.approx(0.5)
    assert out.metrics["loss/clip_ratio_low"] == pytest.approx(0.5)
    assert out.metrics["loss/clip_ratio_region"] == pytest.approx(1.0)
    assert out.loss.item() == pytest.approx((-1.28 * 1 + 0.8 * 1) / 2)


def test_masked_tokens_never_reach_the_loss(lm: ModuleType) -> None:
    torch = lm.torch
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    logps = torch.tensor([[-1.0, -2.0, -3.0, -4.0]], requires_grad=True)
    for loss_type in ("grpo", "dr_grpo", "dapo"):
        out = lm.grpo_loss(logps, torch.tensor([1.0]), mask, spec(lm, loss_type=loss_type,
                           beta=0.1, length_norm=4), ref_logps=torch.full((1, 4), -2.5))
        (grad,) = torch.autograd.grad(out.loss, logps)
        assert grad[0, 0].item() == 0.0 and grad[0, 3].item() == 0.0, loss_type
        assert grad[0, 1].item() != 0.0, loss_type


def test_aggregation_normalisers_for_gradient_accumulation(lm: ModuleType) -> None:
    torch = lm.torch
    per_token = torch.tensor([[1.0, 1.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert lm.aggregate(per_token, mask, spec(lm, loss_type="grpo")).item() == 2.0
    assert lm.aggregate(per_token, mask, spec(lm, loss_type="dapo")).item() == pytest.approx(5 / 3)
    dr = spec(lm, loss_type="dr_grpo", length_norm=10)
    assert lm.aggregate(per_token, mask, dr).item() == pytest.approx(5 / 20)
    # two micro-batches with the step's totals sum to the whole batch's loss
    for s in (spec(lm, loss_type="grpo"), spec(lm, loss_type="dapo"), dr):
        whole = lm.aggregate(per_token, mask, s)
        parts = sum(lm.aggregate(per_token[i:i + 1], mask[i:i + 1], s, num_sequences=2,
                                 num_items=3) for i in range(2))
        assert parts.item() == pytest.approx(whole.item())


def test_sampling_metrics_report_weights_and_drift(lm: ModuleType) -> None:
    torch = lm.torch
    logps = torch.tensor([[0.0, -1.0, -2.0]])
    engine = torch.tensor([[float("nan"), -1.5, -1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    out = lm.grpo_loss(logps, torch.tensor([1.0]), mask, spec(lm), engine_logps=engine)
    assert out.metrics["sampling/logprob_drift_max"] == pytest.approx(1.0)
    assert out.metrics["sampling/logprob_drift_mean"] == pytest.approx(0.75)
    assert out.metrics["sampling/is_ratio_max"] == pytest.approx(math.exp(0.5))
    assert out.metrics["sampling/is_ratio_min"] == pytest.approx(math.exp(-1.0))
    off = lm.grpo_loss(logps, torch.tensor([1.0]), mask, spec(lm, is_correction=False),
                       engine_logps=engine)
    assert "sampling/is_ratio_max" not in off.metrics
    assert off.loss.item() != pytest.approx(out.loss.item())


def test_the_high_entropy_mask_keeps_the_top_share_of_trained_tokens_only(
    lm: ModuleType,
) -> None:
    torch = lm.torch
    entropies = torch.tensor([[0.1, 0.5, 0.9, 2.0], [0.7, 0.2, 0.8, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # 2.0 is not trained
    # the 7 trained entropies sorted: 0.0 0.1 0.2 0.5 0.7 0.8 0.9; the half's quantile is 0.5
    half = lm.high_entropy_mask(entropies, mask, 0.5)
    assert half.tolist() == [[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]]
    assert lm.high_entropy_mask(entropies, mask, 0.0).tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]]
    assert lm.high_entropy_mask(entropies, mask, 1.0).tolist() == mask.tolist()
    assert not lm.high_entropy_mask(entropies, torch.zeros_like(mask), 0.5).any()
    per_token_spec = spec(lm, top_entropy_quantile=0.5)
    with pytest.raises(ValueError, match="needs entropies"):
        lm.grpo_loss(torch.zeros(2, 4), torch.ones(2), mask, per_token_spec)
    out = lm.grpo_loss(torch.zeros(2, 4), torch.ones(2), mask, per_token_spec,
                       entropies=entropies)  # fmt: skip
    assert out.metrics["loss/high_entropy_share"] == pytest.approx(4 / 7)


def test_off_policy_masking_drops_only_drifted_rows_with_negative_advantages(
    lm: ModuleType,
) -> None:
    torch = lm.torch
    logps = torch.tensor([[-1.0, -1.0, -1.0]] * 4)
    # mean (sampling - policy) over trained tokens: 0.6, 0.6, 0.1, 0.45 (a NaN token adds 0)
    sampling = torch.tensor([[-0.4, -0.4, -9.0], [-0.4, -0.4, -9.0], [-0.9, -0.9, -9.0],
                             [-0.1, float("nan"), -9.0]])  # fmt: skip
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    advantages = torch.tensor([[1.0], [-1.0], [-1.0], [-1.0]])
    kept = lm.off_policy_sequence_mask(advantages, logps, sampling, mask, threshold=0.5)
    assert kept.flatten().tolist() == [1.0, 0.0, 1.0, 1.0]


def test_kl_needs_reference_logprobs(lm: ModuleType) -> None:
    torch = lm.torch
    with pytest.raises(ValueError, match="ref_logps"):
        lm.grpo_loss(torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), spec(lm, beta=0.1))


def test_spec_from_config_resolves_epsilon_high_and_length_norm(lm: ModuleType) -> None:
    from agentgym.trainers._config import GRPOConfig

    config = GRPOConfig(max_completion_length=32, loss_type="dr_grpo")
    resolved = lm.LossSpec.from_config(config, max_turns=4)
    assert (resolved.epsilon_high, resolved.length_norm, resolved.is_cap) == (0.2, 128, 3.0)


def test_spec_from_config_carries_every_loss_knob(lm: ModuleType) -> None:
    """Each spec field comes from the config: set away from its default, it shows in the spec."""
    from agentgym.trainers._config import GRPOConfig

    knobs = {
        "loss_type": "grpo", "importance_sampling_level": "sequence", "beta": 0.04,
        "top_entropy_quantile": 0.2, "delta": 4.0, "off_policy_mask_threshold": 0.5,
        "entropy_coef": 0.01, "sapo_temperature_pos": 0.9, "sapo_temperature_neg": 1.2,
        "vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5, "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.5,
        "epsilon": 0.1, "epsilon_high": 0.3, "vllm_importance_sampling_correction": False,
        "vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_max": 2.0,
        "vllm_importance_sampling_clip_min": 0.5, "use_bias_correction_kl": False,
    }  # fmt: skip
    spec_ = lm.LossSpec.from_config(GRPOConfig(max_completion_length=32, **knobs))
    default = lm.LossSpec()
    changed = {f: getattr(spec_, f) for f in default.__dataclass_fields__
               if getattr(spec_, f) != getattr(default, f)}  # fmt: skip
    assert changed == {
        **{k: v for k, v in knobs.items() if k in default.__dataclass_fields__},
        "epsilon_low": 0.1, "epsilon_high": 0.3, "is_correction": False, "is_mode": "token_mask",
        "is_cap": 2.0, "is_floor": 0.5, "kl_bias_correction": False, "length_norm": 32,
    }  # fmt: skip


# --- agreement with TRL 1.16 ---------------------------------------------------------------------

TEMPERATURE = 0.7
PROMPT_LEN, COMPLETION_LEN = 5, 6


@pytest.fixture(scope="module")
def trl_trainer(lm: ModuleType, tiny_model_dir: Any, tmp_path_factory: Any) -> Any:
    """A TRL GRPOTrainer on the tiny model; knobs are switched per case on the instance."""
    trl = require("trl")
    datasets = require("datasets")
    transformers = require("transformers")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch = lm.torch
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")), per_device_train_batch_size=4,
        num_generations=2, max_completion_length=COMPLETION_LEN, temperature=TEMPERATURE,
        report_to="none", use_cpu=True, bf16=False, logging_steps=1,
    )
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": ["a", "b"]}),
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _batch(lm: ModuleType, model: Any) -> SimpleNamespace:
    """Two groups of two: a left-padded prompt, ragged completions, an env-token span."""
    torch = lm.torch
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(0, 250, (4, PROMPT_LEN), generator=g)
    prompt_mask = torch.ones(4, PROMPT_LEN, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding, as TRL pads prompts
    completion_ids = torch.randint(0, 250, (4, COMPLETION_LEN), generator=g)
    completion_mask = torch.ones(4, COMPLETION_LEN, dtype=torch.long)
    completion_mask[2, 4:] = 0  # a shorter completion, right-padded
    completion_mask[3, 2:] = 0
    tool_mask = torch.ones(4, COMPLETION_LEN, dtype=torch.long)
    tool_mask[0, 2:4] = 0  # env/tool tokens inside an episode
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        current = lm.token_logprobs(logits, input_ids, TEMPERATURE)[:, PROMPT_LEN:]

    def noise(scale: float) -> Any:
        return scale * torch.randn(current.shape, generator=g)

    return SimpleNamespace(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
        completion_mask=completion_mask, tool_mask=tool_mask, input_ids=input_ids,
        attention_mask=attention_mask,
        advantages=torch.tensor([1.0, -1.0, 0.7, -0.7]),
        # far enough from current that both clip bounds bite, per token and per sequence
        old=current + noise(0.3) + torch.tensor([[-0.4], [0.4], [0.0], [0.0]]),
        engine=current + noise(0.5),
        ref=current + noise(0.2),
    )


def _trl_inputs(lm: ModuleType, b: SimpleNamespace, s: Any) -> dict[str, Any]:
    mask = b.completion_mask * b.tool_mask
    weights = lm.importance_weights(b.old, b.engine, mask.float(), s.is_cap, floor=s.is_floor,
                                    mode=s.is_mode)  # fmt: skip
    return {
        "prompt_ids": b.prompt_ids, "prompt_mask": b.prompt_mask,
        "completion_ids": b.completion_ids, "completion_mask": b.completion_mask,
        "tool_mask": b.tool_mask, "advantages": b.advantages, "old_per_token_logps": b.old,
        "ref_per_token_logps": b.ref, "importance_sampling_ratio": weights,
        "num_items_in_batch": mask.sum(), "sampling_per_token_logps": b.engine,
    }


def _ours(lm: ModuleType, model: Any, b: SimpleNamespace, s: Any, with_is: bool) -> Any:
    torch = lm.torch
    pad = torch.zeros(4, PROMPT_LEN)
    mask = torch.cat([pad, (b.completion_mask * b.tool_mask).float()], 1)
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
    return lm.grpo_loss(
        lm.token_logprobs(logits, b.input_ids, TEMPERATURE), b.advantages, mask, s,
        old_logps=torch.cat([pad, b.old], 1),
        engine_logps=torch.cat([pad, b.engine], 1) if with_is else None,
        ref_logps=torch.cat([pad, b.ref], 1),
        entropies=lm.token_entropy(logits if s.entropy_coef else logits.detach(), TEMPERATURE),
    )


def _grads(lm: ModuleType, model: Any, loss: Any) -> list[Any]:
    params = [p for p in model.parameters() if p.requires_grad]
    return list(lm.torch.autograd.grad(loss, params))


def _set_trl_knobs(trainer: Any, s: Any, with_is: bool = True) -> None:
    """TRL's trainer set from the spec ``s`` in every knob (adaptive entropy control off)."""
    trainer.loss_type, trainer.importance_sampling_level = s.loss_type, s.importance_sampling_level
    trainer.beta, trainer.epsilon_low, trainer.epsilon_high = s.beta, s.epsilon_low, s.epsilon_high
    trainer.use_vllm = with_is  # TRL applies inputs["importance_sampling_ratio"] only then
    trainer.vllm_importance_sampling_correction = True
    trainer.top_entropy_quantile = s.top_entropy_quantile
    trainer.off_policy_mask_threshold = s.off_policy_mask_threshold
    trainer.entropy_coef, trainer._entropy_bonus_enabled = s.entropy_coef, bool(s.entropy_coef)
    trainer.use_adaptive_entropy = False
    trainer.args.delta, trainer.args.use_bias_correction_kl = s.delta, s.kl_bias_correction
    trainer.args.sapo_temperature_pos = s.sapo_temperature_pos
    trainer.args.sapo_temperature_neg = s.sapo_temperature_neg
    trainer.args.vespo_k_pos, trainer.args.vespo_lambda_pos = s.vespo_k_pos, s.vespo_lambda_pos
    trainer.args.vespo_k_neg, trainer.args.vespo_lambda_neg = s.vespo_k_neg, s.vespo_lambda_neg


def _both_losses(
    lm: ModuleType, trainer: Any, s: Any, with_is: bool = True
) -> tuple[Any, Any, SimpleNamespace]:
    """Our loss and TRL's on one batch, TRL's trainer set from the spec ``s`` in every knob."""
    _set_trl_knobs(trainer, s, with_is)
    batch = _batch(lm, trainer.model)
    inputs = _trl_inputs(lm, batch, s)
    if not with_is:  # TRL adds the ratios to a batch only with vLLM (VESPO reads them anyway)
        del inputs["importance_sampling_ratio"]
    theirs = trainer._compute_loss(trainer.model, inputs)
    return _ours(lm, trainer.model, batch, s, with_is), theirs, batch


def _assert_agree(
    lm: ModuleType, model: Any, ours: Any, theirs: Any, loss_rtol: float = LOSS_RTOL
) -> None:
    assert ours.loss.item() == pytest.approx(theirs.item(), rel=loss_rtol, abs=LOSS_ATOL)
    for mine, trls in zip(_grads(lm, model, ours.loss), _grads(lm, model, theirs), strict=True):
        assert lm.torch.allclose(mine, trls, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def _loss_spec(lm: ModuleType, loss_type: str = "dapo", **knobs: Any) -> Any:
    """The agreement tests' spec: DAPO's epsilon_high, a KL term, Dr. GRPO's constant."""
    return spec(lm, **{"loss_type": loss_type, "epsilon_high": 0.28, "beta": 0.04,
                       "length_norm": COMPLETION_LEN, **knobs})  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("with_is", [False, True], ids=["no_is", "is"])
@pytest.mark.parametrize("beta", [0.0, 0.04], ids=["no_kl", "kl"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_loss_and_gradients_agree_with_trl(
    lm: ModuleType, trl_trainer: Any, loss_type: str, level: str, beta: float, with_is: bool
) -> None:
    s = _loss_spec(lm, loss_type, importance_sampling_level=level, beta=beta)
    ours, theirs, _ = _both_losses(lm, trl_trainer, s, with_is)
    assert ours.metrics["loss/clip_ratio_region"] > 0  # the case exercises clipping
    _assert_agree(lm, trl_trainer.model, ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("quantile", [0.5, 0.2, 0.0])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_the_high_entropy_loss_agrees_with_trl(
    lm: ModuleType, trl_trainer: Any, loss_type: str, quantile: float
) -> None:
    """``top_entropy_quantile``: the same tokens kept, the same loss and gradients as TRL's."""
    s = _loss_spec(lm, loss_type, top_entropy_quantile=quantile)
    ours, theirs, _ = _both_losses(lm, trl_trainer, s)
    assert 0 < ours.metrics["loss/high_entropy_share"] < 1  # the case drops some tokens
    _assert_agree(lm, trl_trainer.model, ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["token_mask", "sequence_truncate", "sequence_mask"])
def test_the_loss_under_each_importance_sampling_mode_agrees_with_trl(
    lm: ModuleType, trl_trainer: Any, mode: str
) -> None:
    """A ``(B, 1)`` sequence ratio or a masked token weighs the loss as TRL weighs it."""
    s = _loss_spec(lm, is_mode=mode, is_cap=2.0, is_floor=0.5)  # some ratios fall outside
    ours, theirs, _ = _both_losses(lm, trl_trainer, s)
    if mode.endswith("mask"):
        assert 0 < ours.metrics["sampling/is_masked_share"] < 1  # the case masks something
    _assert_agree(lm, trl_trainer.model, ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize(
    "knobs",
    [
        pytest.param({"delta": 1.3}, id="two-sided-clip"),
        pytest.param({"kl_bias_correction": False}, id="plain-kl"),
        pytest.param({"off_policy_mask_threshold": 0.05}, id="off-policy-mask"),
        pytest.param({"entropy_coef": 0.3}, id="entropy-bonus"),
        pytest.param({"entropy_coef": 0.3, "top_entropy_quantile": 0.5},
                     id="entropy-bonus-high-entropy"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_trls_other_loss_knobs_agree_with_trl(
    lm: ModuleType, trl_trainer: Any, loss_type: str, knobs: dict
) -> None:
    """``delta``, ``use_bias_correction_kl``, ``off_policy_mask_threshold``, ``entropy_coef``."""
    ours, theirs, batch = _both_losses(lm, trl_trainer, _loss_spec(lm, loss_type, **knobs))
    if "off_policy_mask_threshold" in knobs:
        assert 0 < ours.metrics["loss/off_policy_masked_share"] < 1  # the case masks a row
    without = _ours(lm, trl_trainer.model, batch, _loss_spec(lm, loss_type), True)
    assert ours.loss.item() != pytest.approx(without.loss.item())  # the knob changes the loss
    _assert_agree(lm, trl_trainer.model, ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("quantile", [1.0, 0.5])
def test_adaptive_entropy_control_agrees_with_trl(
    lm: ModuleType, trl_trainer: Any, quantile: float
) -> None:
    """``use_adaptive_entropy``: over four optimiser steps, the same coefficient, gate and loss.

    Each call of TRL's ``_compute_loss`` outside gradient accumulation is one optimiser
    step's window, so it moves TRL's coefficient as `EntropyControl.observe` moves ours. The
    targets take it up, to its cap, then (below the entropy) off and down.
    """
    from agentgym.trainers._entropy_control import EntropyControl

    trainer = trl_trainer
    s = _loss_spec(lm, "dapo", top_entropy_quantile=quantile)
    _set_trl_knobs(trainer, s)
    trainer.entropy_coef = 0.3
    trainer.use_adaptive_entropy = trainer._entropy_bonus_enabled = True
    trainer._last_world_entropy, trainer._entropy_window_stats = math.inf, None
    trainer.args.entropy_coef_delta, trainer.args.entropy_coef_min = 0.1, 0.0
    trainer.args.entropy_coef_max = 0.45
    control = EntropyControl(coef=0.3, target=0.0, delta=0.1, low=0.0, high=0.45)
    batch = _batch(lm, trainer.model)
    inputs = _trl_inputs(lm, batch, s)
    applied = []
    try:
        for target in (100.0, 100.0, 100.0, 0.01):  # nats: above, then below, any entropy here
            trainer.args.entropy_target = control.target = target
            applied.append(control.applied)
            now = dataclasses.replace(s, entropy_coef=control.applied)
            ours = _ours(lm, trainer.model, batch, now, True)
            theirs = trainer._compute_loss(trainer.model, inputs)
            _assert_agree(lm, trainer.model, ours, theirs)
            control.observe(*ours.trained_entropy)
            assert control.coef == pytest.approx(trainer.entropy_coef, abs=1e-9)
            assert control.last_entropy == pytest.approx(trainer._last_world_entropy, rel=1e-6)
    finally:
        trainer.use_adaptive_entropy = False
    assert applied == pytest.approx([0.0, 0.4, 0.45, 0.0])  # gated, raised, capped, gated
    assert control.coef == pytest.approx(0.35)  # and lowered


@pytest.mark.slow
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize(
    ("loss_type", "knobs"),
    [("cispo", {"epsilon_high": 1.2}),
     ("sapo", {"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05}), ("luspo", {})],
)  # fmt: skip
def test_cispo_sapo_and_luspo_agree_with_trl(
    lm: ModuleType, trl_trainer: Any, loss_type: str, knobs: dict, level: str
) -> None:
    s = _loss_spec(lm, loss_type, importance_sampling_level=level, **knobs)
    ours, theirs, _ = _both_losses(lm, trl_trainer, s)
    _assert_agree(lm, trl_trainer.model, ours, theirs)
    if loss_type == "cispo" and level == "token":
        assert ours.metrics["loss/clip_ratio_high"] > 0  # the case caps some weights


@pytest.mark.slow
@pytest.mark.parametrize("with_is", [False, True], ids=["no_is", "is"])
@pytest.mark.parametrize("mode", ["token_truncate", "token_mask"])
def test_vespo_agrees_with_trl(lm: ModuleType, trl_trainer: Any, mode: str, with_is: bool) -> None:
    """VESPO's gamma weight, with the engine correction folded in as TRL folds it."""
    s = _loss_spec(lm, "vespo", is_mode=mode, is_cap=2.0, is_floor=0.5)
    ours, theirs, batch = _both_losses(lm, trl_trainer, s, with_is)
    # exp(lambda + k log w - lambda w) of sums over a row's tokens: rounding differences in
    # the two sides' logprobs (TRL's fused head) grow to ~2e-6 of the loss here
    _assert_agree(lm, trl_trainer.model, ours, theirs, loss_rtol=1e-5)
    without = _ours(lm, trl_trainer.model, batch, _loss_spec(lm, "dapo"), with_is)
    assert ours.loss.item() != pytest.approx(without.loss.item())


def test_vespos_weight_is_its_gamma_function_of_the_sequence_ratio() -> None:
    """phi(w) = exp(lam + k log w - lam w): 1 at w = 1 for either sign, smaller far from it."""
    lm = importlib.import_module("agentgym.trainers._loss")
    torch = lm.torch
    s = spec(lm, loss_type="vespo")
    mask = torch.ones(5, 2)
    # row log-ratios summed over 2 tokens: 0, 0, log 0.25, log 4, 0 with a halving engine weight
    token_log_ratio = torch.log(torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.5, 0.5], [2.0, 2.0],
                                              [1.0, 1.0]]))  # fmt: skip
    advantages = torch.tensor([[1.0], [-1.0], [1.0], [1.0], [1.0]])
    is_weights = torch.ones(5, 2)
    is_weights[4, 0] = 0.5
    phi = lm.vespo_weights(advantages, token_log_ratio, mask, is_weights, s).flatten().tolist()
    w = [1.0, 1.0, 0.25, 4.0, 0.5]
    expected = [math.exp(3 + 2 * math.log(x) - 3 * x) for x in w]
    expected[1] = 1.0  # k 3, lambda 2 at w = 1
    assert phi == pytest.approx(expected, rel=1e-5)
    assert phi[0] == pytest.approx(1.0) and max(phi[2], phi[3]) < 0.6  # w = 0.25 and 4

"""Knob combinations a combinatorial probe of short CPU runs found to crash or mislead.

Each is refused when the config is built, in one line naming the fix, or fixed where it lived.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainers.test_config_checks import _refused
from trainers._config import GRPOConfig
from trainers._loss import LossSpec, grpo_loss


@pytest.mark.parametrize("mode", ["sequence_truncate", "sequence_mask"])
def test_an_uncapped_sequence_ratio_is_refused(mode: str) -> None:
    # the loss this config ran: one sample 100 nats off the engine gets weight inf, so the
    # step's loss is not finite (its update skipped) however the other samples look
    spec = LossSpec(is_mode=mode, is_cap=None)
    logps = torch.full((2, 21), -1.0, requires_grad=True)
    mask = torch.ones(2, 21)
    engine = torch.full((2, 21), -1.0)
    engine[0] -= 5.0
    out = grpo_loss(logps, torch.tensor([1.0, -1.0]), mask, spec, engine_logps=engine)
    assert not torch.isfinite(out.loss)
    _refused("vllm_importance_sampling_clip_max", vllm_importance_sampling_mode=mode,
             vllm_importance_sampling_clip_max=None)  # fmt: skip


def test_an_uncapped_ratio_still_runs_where_it_is_bounded() -> None:
    # per token, or with the correction off, None keeps its documented meaning
    GRPOConfig(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=None)
    GRPOConfig(vllm_importance_sampling_mode="sequence_mask",
               vllm_importance_sampling_clip_max=None,
               vllm_importance_sampling_correction=False)  # fmt: skip


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_delta_is_named_where_there_is_no_clip_to_cap(loss_type: str) -> None:
    # delta was accepted and silently ignored: these losses weigh the ratio without the PPO
    # clip. Warned, not refused: TRL ignores it too, and a run saved with it must resume
    knobs: dict[str, Any] = {"loss_type": loss_type, "delta": 8.0}
    if loss_type == "cispo":
        knobs["epsilon_high"] = 5.0
    with pytest.warns(UserWarning, match=f"loss_type={loss_type!r} does not use: it is ignored"):
        GRPOConfig(**knobs)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "luspo"])
def test_delta_caps_the_clipped_losses(loss_type: str) -> None:
    level = "sequence" if loss_type == "luspo" else "token"  # as published: no warning
    config = GRPOConfig(loss_type=loss_type, delta=4.0,  # type: ignore[arg-type]
                        importance_sampling_level=level)
    spec = LossSpec.from_config(config)
    logps = torch.tensor([[0.0, 2.0]], requires_grad=True)  # ratio e^2 = 7.4 > delta
    out = grpo_loss(logps, torch.tensor([-1.0]), torch.tensor([[0.0, 1.0]]), spec,
                    old_logps=torch.zeros(1, 2))  # fmt: skip
    norm = spec.length_norm if loss_type == "dr_grpo" else 1  # one sequence, one token
    assert out.loss.item() == pytest.approx(4.0 / norm)  # -min(delta * A, clip * A), not e^2


@pytest.mark.parametrize("loss_type", ["sapo", "vespo"])
def test_epsilon_high_is_named_where_there_is_no_clip(loss_type: str) -> None:
    # DAPO's epsilon_high: 0.28 carried into a sapo/vespo recipe was accepted and ignored
    with pytest.warns(UserWarning, match="epsilon_high=0.28 bounds the PPO clip"):
        GRPOConfig(loss_type=loss_type, epsilon_high=0.28)  # type: ignore[arg-type]


@pytest.mark.parametrize("scale", ["batch", "none"])
def test_scale_rewards_is_named_where_gdpo_ignores_it(scale: str) -> None:
    with pytest.warns(UserWarning, match=f"scale_rewards={scale!r} does not apply"):
        GRPOConfig(scale_rewards=scale,  # type: ignore[arg-type]
                   multi_objective_aggregation="normalize_then_sum")


@pytest.mark.parametrize(("knob", "value"), [("vllm_importance_sampling_clip_max", 0.5),
                                             ("vllm_importance_sampling_clip_min", 1.5)])
def test_importance_bounds_that_leave_out_an_on_policy_ratio_are_refused(
    knob: str, value: float
) -> None:
    # a cap below 1 (or a floor above it) moved or masked every token, on-policy ones too
    _refused(knob, **{knob: value})


def test_vespo_weighs_only_the_trained_tokens_engine_ratios() -> None:
    # clip_max 0.5 truncates every ratio of 1 to 0.5, the prompt's too: they entered VESPO's
    # sequence weight, so a row of 2 trained tokens after 28 prompt tokens got phi(0.5^30) ~ 0
    spec = LossSpec(loss_type="vespo", is_cap=0.5)
    logps = torch.full((1, 30), -1.0, requires_grad=True)
    mask = torch.zeros(1, 30)
    mask[0, 28:] = 1
    out = grpo_loss(logps, torch.tensor([1.0]), mask, spec, engine_logps=torch.full((1, 30), -1.0))
    w = torch.tensor(0.25)  # the two trained tokens' truncated ratios, multiplied
    phi = torch.exp(spec.vespo_lambda_pos + spec.vespo_k_pos * w.log() - spec.vespo_lambda_pos * w)
    assert out.loss.item() == pytest.approx((phi * 1.0).item(), rel=1e-5)  # -phi * A * logp


def test_the_train_command_says_a_config_rules_warning_in_one_line(tmp_path: Path) -> None:
    """Python printed it with our source line (trainers/_config.py:620) and the code there,
    not the user's config; the command says ``warning: ...`` as it says ``error: ...``."""
    import subprocess
    import sys

    agentgym = Path(sys.executable).with_name("agentgym")
    # the smallest train config: the warnings come from the config rules, and checking the
    # quickstart's plan (its 1,872-trace warm start) took 6 s more here for nothing tested
    config = tmp_path / "run.yaml"
    config.write_text(f"env: calculator\noutput_dir: {tmp_path / 'run'}\nreport_to: [none]\n")
    done = subprocess.run(
        [agentgym, "train", config, "--dry-run",
         "--set", "loss_type=luspo", "--set", "importance_sampling_level=token",
         "--set", "vllm_importance_sampling_cap=3.0"],  # a renamed key: a FutureWarning
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-2000:]
    assert "warning: loss_type='luspo' with importance_sampling_level='token'" in said
    assert "warning: config key 'vllm_importance_sampling_cap'" in said
    assert "Warning:" not in said and "_config.py" not in said  # not Python's own format

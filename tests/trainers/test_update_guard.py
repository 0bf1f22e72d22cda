"""A non-finite gradient never reaches the adapter: the update is skipped, counted and logged.

On the real stack (peft LoRA on the tiny model, the trainer's own `_update`); a NaN advantage
stands in for what makes such a gradient in practice (a bf16 overflow on a GPU, a NaN reward).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from tests.conftest import require
from tests.trainers.test_distributed import synthetic_samples, update_config


@pytest.mark.parametrize("max_grad_norm", [None, 1.0])
def test_a_nan_gradient_skips_the_update_and_the_next_one_trains(
    tmp_path: Path, max_grad_norm: float | None, caplog: pytest.LogCaptureFixture
) -> None:
    torch = require("torch")
    require("peft")
    from agentgym.trainers import GRPOTrainer, LossSpec

    changes = {"loss_type": "dapo", "max_grad_norm": max_grad_norm, "num_iterations": 1}
    trainer = GRPOTrainer(update_config(tmp_path, changes))
    model, optimizer = trainer._trainable(trainer.model_dir)
    spec = LossSpec.from_config(trainer.config, max_turns=trainer.env_max_turns)

    def adapter() -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    before, samples = adapter(), synthetic_samples()
    poisoned = [dataclasses.replace(s, advantage=math.nan) if s.episode == 2 else s
                for s in samples]  # fmt: skip
    skipped = trainer._update(model, optimizer, poisoned, spec)
    assert skipped["train/skipped_updates"] == 1.0
    assert all(torch.equal(p, before[n]) for n, p in adapter().items())  # not one NaN written
    assert not optimizer.state  # Adam's moments untouched too
    assert "step update 1 of 1 skipped: the gradient is not finite (nan)" in caplog.text

    trained = trainer._update(model, optimizer, samples, spec)
    assert trained["train/skipped_updates"] == 0.0
    assert trained["train/grad_norm"] > 0  # logged unclipped too (it was only when clipping)
    after = adapter()
    assert all(torch.isfinite(p).all() for p in after.values())
    assert any(not torch.equal(p, before[n]) for n, p in after.items())  # this one trained

"""`EntropyControl`'s own rules (its agreement with TRL: test_loss.py; its resume: test_grpo.py)."""

from __future__ import annotations

import json

import pytest

from agentgym.trainers._entropy_control import EntropyControl


def test_adaptive_entropy_control_moves_only_on_a_measured_step() -> None:
    control = EntropyControl(coef=0.1, target=0.5, delta=0.05, low=0.0, high=1.0)
    control.observe(0.0, 0.0)  # no trained token: no measurement
    assert (control.coef, control.applied) == (0.1, 0.0)
    control.observe(4.0, 10.0)  # 0.4 nats <= 0.5: up, and applied from the next step
    assert control.coef == pytest.approx(0.15) and control.applied == pytest.approx(0.15)
    restored = EntropyControl(coef=0.0, target=0.5, delta=0.05, low=0.0, high=1.0)
    restored.restore(json.loads(json.dumps(control.state())))
    assert (restored.coef, restored.last_entropy) == (control.coef, control.last_entropy)
    fresh = EntropyControl(coef=0.2, target=0.5, delta=0.05, low=0.0, high=1.0)
    # before any step: inf survives a strict JSON round trip
    restored.restore(json.loads(json.dumps(fresh.state(), allow_nan=False)))
    assert restored.last_entropy == float("inf") and restored.applied == 0.0

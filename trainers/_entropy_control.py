"""Adaptive entropy control (Skywork-OR1; TRL's ``use_adaptive_entropy``).

A fixed entropy bonus is hard to set: too small and the policy collapses, too large and it
stays random. The controller raises the bonus's coefficient by ``entropy_coef_delta`` after
every optimiser step whose trained tokens had a mean entropy at or below
``entropy_target``, lowers it otherwise (within ``[entropy_coef_min, entropy_coef_max]``),
and applies it only while the last step's entropy was at or below the target. It is part of
the training state: a checkpoint holds it, so a resumed run applies the coefficient the
killed one would have (`GRPOTrainer` saves and restores it). The rules are TRL 1.16's,
checked against its `GRPOTrainer._compute_loss` in `tests/trainers/test_loss.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._config import GRPOConfig


@dataclass
class EntropyControl:
    """The coefficient and the last step's entropy; `observe` moves them after each step."""

    coef: float
    target: float
    delta: float
    low: float
    high: float
    #: Mean entropy of the last optimiser step's trained tokens; inf before the first, so the
    #: first step applies no bonus until a real measurement arrives (as TRL).
    last_entropy: float = math.inf

    @classmethod
    def from_config(cls, config: GRPOConfig) -> EntropyControl | None:
        """The controller of a `GRPOConfig`, or None when it does not use one."""
        if not config.use_adaptive_entropy:
            return None
        return cls(config.entropy_coef, config.entropy_target, config.entropy_coef_delta,
                   config.entropy_coef_min, config.entropy_coef_max)  # fmt: skip

    @property
    def applied(self) -> float:
        """The coefficient this step's loss uses: 0 while the entropy is above the target."""
        return self.coef if self.last_entropy <= self.target else 0.0

    def observe(self, entropy_sum: float, tokens: float) -> None:
        """Move the coefficient after an optimiser step, from its trained tokens' entropy.

        ``entropy_sum`` and ``tokens`` are the step's totals over every micro-batch and rank,
        so the mean is the step's, not one micro-batch's. A step that trained no token
        measured nothing and moves nothing (TRL would read its entropy as 0).
        """
        if tokens <= 0:
            return
        entropy = entropy_sum / tokens
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.high)
        else:
            self.coef = max(self.coef - self.delta, self.low)
        self.last_entropy = entropy

    def state(self) -> dict[str, float | str]:
        """What a checkpoint stores (strict JSON: an infinite entropy is written as a string)."""
        return {"entropy_coef": self.coef, "last_entropy": _json_float(self.last_entropy)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's `state`."""
        self.coef = float(state["entropy_coef"])
        self.last_entropy = float(state["last_entropy"])


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)

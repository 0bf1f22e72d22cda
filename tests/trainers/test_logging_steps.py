"""`logging_steps`: trackers get every N-th step, the last one and every eval; the run's own
metrics.jsonl keeps every step (resume and the curves read it)."""

from __future__ import annotations

from agentgym.trainers import GRPOConfig
from agentgym.trainers._grpo import _log_due


def test_trackers_get_every_nth_step_the_last_and_evals() -> None:
    cfg = GRPOConfig(env="calculator", max_steps=10, logging_steps=4)
    due = [s for s in range(1, 11) if _log_due(s, cfg, {})]
    assert due == [4, 8, 10]
    assert _log_due(5, cfg, {"eval/success": 0.5})

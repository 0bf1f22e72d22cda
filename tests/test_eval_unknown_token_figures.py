"""The eval summary's token figures: unknown is not zero.

Why: an OpenAI-compatible server other than vLLM returns no token ids, and the summary said
``tokens/completions_total: 0`` and ``tokens/per_episode: 0.0`` for an eval whose replies
were long: read as an eval that sampled nothing.
"""

from __future__ import annotations

from agentgym import summarize
from agentgym._trajectory import Trajectory, Turn


def episode(*turns: Turn) -> Trajectory:
    return Trajectory("e", task_index=0, task_position=0, turns=list(turns), final_reward=1.0)


def test_a_backend_without_token_ids_has_no_token_figures() -> None:
    summary = summarize([episode(Turn(text="The answer is 5."))])
    assert summary["tokens/completions_total"] is None
    assert summary["tokens/per_episode"] is None
    assert summary["reward/mean"] == 1.0  # the rest is figured as before


def test_token_ids_are_counted_and_an_empty_completion_is_zero() -> None:
    summary = summarize([episode(Turn(completion_ids=[1, 2, 3])), episode(Turn(completion_ids=[]))])
    assert summary["tokens/completions_total"] == 3
    assert summary["tokens/per_episode"] == 1.5

"""Ctrl-C (and ``kill``, which the CLI turns into it) stops a rollout before its next episode.

asyncio's Ctrl-C handler cancels the running task from inside it. Requested just before a
tool call began, that cancellation was taken for the tool's own ``CancelledError``: the
episode played on with a tool error the stop caused, was recorded as the model's, and the
eval went on (one in three ``kill``s of a 100,000-episode eval never ended).
"""

from __future__ import annotations

import signal

import pytest

from agentgym import Completion, Rubric, ToolEnv, rollout, tool
from tests.conftest import hermes_call


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def says_answer(completion: str, answer: str) -> float:
    return float(completion == answer)


class AddEnv(ToolEnv):
    def __init__(self) -> None:
        super().__init__([add], tasks=[{"prompt": "1 + 2?", "answer": "3"}],
                         rubric=Rubric([says_answer]))  # fmt: skip


class CtrlCAtEpisode:
    """Calls `add`, then answers; on episode ``at``, Ctrl-C lands just before the call."""

    def __init__(self, at: int) -> None:
        self.at, self.started = at, 0

    async def generate(self, messages, tools, *, max_tokens=None, task=None) -> Completion:
        if messages[-1]["role"] != "user":
            return Completion(text="3")
        self.started += 1
        if self.started == self.at:
            signal.raise_signal(signal.SIGINT)  # handled here, in the running task
        return Completion(text=hermes_call("add", a=1, b=2))


@pytest.mark.parametrize("concurrency", [1, 4])
def test_ctrl_c_stops_the_rollout_and_keeps_no_episode_it_cut(concurrency: int) -> None:
    kept = []
    policy = CtrlCAtEpisode(at=6)
    # as at a terminal: a pytest-xdist worker starts with SIGINT ignored, and then neither
    # asyncio's handler nor any KeyboardInterrupt comes
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            rollout(AddEnv, policy, tasks=[0], group_size=200, max_concurrency=concurrency,
                    on_episode=kept.append)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, before)
    assert policy.started == 6  # none began after the stop
    # those still playing with the sixth were cut with it: not kept either
    assert len(kept) == 5 if concurrency == 1 else len(kept) < 6
    assert {t.status for t in kept} == {"ok"}
    assert not any("Error" in str(m["content"]) for t in kept for m in t.messages)

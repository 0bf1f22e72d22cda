"""The running episode's deadline, for a policy whose sampling blocks the event loop.

Why: a rollout's deadline cuts an episode by cancelling its task, which needs the loop to
run. `HFPolicy` samples on the loop's own thread, so a batch begun before the deadline ran to
its end (a rollout with a 0.5 s deadline returned tens of seconds late) and the turns it
finished counted. Such a policy reads the deadline here and stops its batch there instead.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_deadline_at: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "agentgym_episode_deadline_at", default=None
)


def episode_deadline_at() -> float | None:
    """The event-loop time (`loop.time()`) by which the running episode must end, or None."""
    return _deadline_at.get()


@contextmanager
def episode_deadline(deadline_at: float | None) -> Iterator[None]:
    """Make ``deadline_at`` the running episode's deadline while the block runs."""
    token = _deadline_at.set(deadline_at)
    try:
        yield
    finally:
        _deadline_at.reset(token)

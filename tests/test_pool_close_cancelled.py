"""`EnvPool.aclose` cancelled midway still closes the idle envs after the one it was closing.

Why: cut short at its first close, the pool had already dropped the envs after it, which
stayed open (their sandboxes and servers with them) with nothing left to close them.
"""

from __future__ import annotations

import asyncio

import pytest

from agentgym import EnvPool, Rubric, ToolEnv


class SlowCloseEnv(ToolEnv):
    """Its close waits for ``release``; it records that it began and that it ended."""

    def __init__(self, release: asyncio.Event, began: list[int], closed: list[int]) -> None:
        super().__init__([], tasks=[{"prompt": "p", "answer": "a"}], rubric=Rubric([]))
        self.release, self.began, self.closed = release, began, closed

    async def aclose(self) -> None:
        self.began.append(id(self))
        await self.release.wait()
        self.closed.append(id(self))
        await super().aclose()


def test_a_cancelled_close_still_closes_every_idle_env_then_is_cancelled() -> None:
    async def main() -> None:
        release, began, closed = asyncio.Event(), [], []
        pool = EnvPool(lambda: SlowCloseEnv(release, began, closed))
        pool.idle = [pool.take() for _ in range(3)]  # three envs back from their episodes
        closing = asyncio.create_task(pool.aclose())
        while not began:  # the first close is under way
            await asyncio.sleep(0)
        closing.cancel()
        closing.cancel()  # a second cancel (Ctrl-C twice) does not end the wait either
        for _ in range(5):
            await asyncio.sleep(0)
        assert not closing.done()  # waits for the closes, not abandoning them
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await closing
        # the env whose close the cancel reached sees it (its own clean-up is its to finish);
        # every env after it is closed before the cancel goes on
        assert len(began) == 3 and closed == began[1:]
        assert pool.idle == []

    asyncio.run(main())

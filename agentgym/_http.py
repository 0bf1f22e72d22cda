"""`LoopClient`: one httpx connection pool per event loop, opened on first use.

Why: a trainer runs each rollout under its own ``asyncio.run``, and an httpx pool is bound to
the loop that opened it, so a client object that outlives one loop must open a new pool on the
next. httpx is imported on the first request: processes that only step envs never load it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx


class LoopClient:
    """An ``httpx.AsyncClient`` per running loop, with the same options each time."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> httpx.AsyncClient:
        """The pool of the running event loop (a new loop gets a new pool)."""
        import httpx

        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = httpx.AsyncClient(**self._options)
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the pool; the client stays usable (a new pool opens on demand).

        The pool is forgotten before it is closed: a close cancelled midway left a closed
        pool that `get` then handed out (every later request a RuntimeError).
        """
        client, loop = self._client, self._loop
        self._client = self._loop = None
        if client is not None and loop is asyncio.get_running_loop():
            await client.aclose()

"""Awaiting work that must end even when its caller is cancelled.

Why: some work completes on the other side whatever the awaiting side does (a server loads an
adapter, a shop makes a tenant, a database commits a claim). Cut short on this side, it leaves
state that nothing records and nothing undoes. These helpers wait for the work's end, then let
the caller's cancellation go on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

_T = TypeVar("_T")


async def run_to_end(work: Awaitable[_T]) -> _T:
    """Await ``work``; a cancelled caller first waits for it to end, then is cancelled."""
    running = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await through_cancels(running)
        raise


async def through_cancels(future: asyncio.Future[Any]) -> None:
    """Wait for ``future`` to end however often the caller is cancelled meanwhile.

    Why: a second cancel (Ctrl-C twice, a shutdown cancelling what a cancel left waiting)
    ended such a wait early, and what came after it (an undo, a record) never ran. The
    caller's first cancellation is raised by the caller once this returns.
    """
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(future)

"""The last ToolAPI env to close stops the shop without holding up the event loop.

Why: stopping the shop waits for its uvicorn thread to end (up to 10 s), and that wait ran on
the event loop, so every other episode of the rollout stood still meanwhile. uvicorn ends
within a tenth of a second when idle, but waits up to its graceful shutdown (2 s) for a
request still arriving; one such request here, sent by a real client over loopback, makes
the stop slow enough to see the loop stand still with a ticker task.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest

import agentgym
from tests.conftest import require


@pytest.fixture
def toolapi() -> ModuleType:
    require("fastapi")
    require("uvicorn")
    import agentgym.envs.toolapi as module

    return module


@contextlib.asynccontextmanager
async def _shop_with_a_request_arriving() -> AsyncIterator[tuple[Any, Any]]:
    """A fresh ToolAPI env whose shop is in the middle of reading a request, and that shop.

    The request announces a body it never sends: the shop's graceful stop waits for it. Its
    handler task exists once the shop has read the head, which is what makes the stop slow.
    """
    env = agentgym.make("agentgym/ToolAPI-v0")
    server = env.server
    assert server.users == 1, "another env shares the shop: this env's close would not stop it"
    host, port = server.base_url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    try:
        client.sendall(
            b"POST /orders/O1000/cancel HTTP/1.1\r\nHost: shop\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        while not server._server.server_state.tasks:  # the head is read, the body awaited
            await asyncio.sleep(0.01)
        yield env, server
    finally:
        client.close()


async def _longest_gap(until: asyncio.Future[Any]) -> float:
    """The longest the loop went without running this task, until ``until`` is done."""
    longest, last = 0.0, time.monotonic()
    while not until.done():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        longest, last = max(longest, now - last), now
    return longest


async def test_stopping_the_shop_leaves_the_loop_free_and_ends_its_thread(
    toolapi: ModuleType,
) -> None:
    async with _shop_with_a_request_arriving() as (env, server):
        started = time.monotonic()
        closing = asyncio.ensure_future(env.aclose())
        gap = await _longest_gap(closing)
        await closing
        took = time.monotonic() - started
    assert took > 1.0, took  # the stop was slow: it waited for the half-sent request
    assert gap < 0.5, f"the event loop stood still {gap:.2f} s while the shop stopped"
    assert not server.alive and not server._thread.is_alive()  # stopped, its thread ended


async def test_a_close_cancelled_while_the_shop_stops_waits_for_the_stop(
    toolapi: ModuleType,
) -> None:
    """Cancelled midway (a deadline, Ctrl-C), the close still ends with the shop stopped."""
    async with _shop_with_a_request_arriving() as (env, server):
        closing = asyncio.ensure_future(env.aclose())
        while not server._server.should_exit:  # the stop is under way, in its thread
            await asyncio.sleep(0.01)
        closing.cancel()
        closing.cancel()  # a second cancel (Ctrl-C twice) does not end the wait either
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert not server._thread.is_alive()  # the cancel went on only once the shop stopped

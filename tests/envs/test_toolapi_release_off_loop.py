"""The last ToolAPI env to close stops the shop without holding up the event loop.

Why: stopping the shop waits for its uvicorn thread to end (up to 10 s), and that wait ran on
the event loop, so every other episode of the rollout stood still meanwhile. uvicorn ends
within a tenth of a second when idle, but waits up to its graceful shutdown (2 s) for a
request still arriving; one such request here, sent by a real client over loopback, makes
the stop slow enough to see the loop stand still with a ticker task.
"""

from __future__ import annotations

import asyncio
import socket
import time
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


def _half_sent_request(base_url: str) -> socket.socket:
    """A connection whose request announced a body it never sends: the shop waits for it."""
    host, port = base_url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    client.sendall(
        b"POST /orders/O1000/cancel HTTP/1.1\r\nHost: shop\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    return client


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
    env = agentgym.make("agentgym/ToolAPI-v0")
    server = env.server
    assert server.users == 1, "another env shares the shop: this env's close would not stop it"
    client = _half_sent_request(server.base_url)
    try:
        await asyncio.sleep(0.2)  # the shop has read the request's head and waits for its body
        started = time.monotonic()
        closing = asyncio.ensure_future(env.aclose())
        gap = await _longest_gap(closing)
        await closing
        took = time.monotonic() - started
    finally:
        client.close()
    assert took > 1.0, took  # the stop was slow: it waited for the half-sent request
    assert gap < 0.5, f"the event loop stood still {gap:.2f} s while the shop stopped"
    assert not server.alive and not server._thread.is_alive()  # stopped, its thread ended


async def test_a_close_cancelled_while_the_shop_stops_waits_for_the_stop(
    toolapi: ModuleType,
) -> None:
    """Cancelled midway (a deadline, Ctrl-C), the close still ends with the shop stopped."""
    env = agentgym.make("agentgym/ToolAPI-v0")
    server = env.server
    assert server.users == 1, "another env shares the shop: this env's close would not stop it"
    client = _half_sent_request(server.base_url)
    try:
        await asyncio.sleep(0.2)
        closing = asyncio.ensure_future(env.aclose())
        while not server._server.should_exit:  # the stop is under way, in its thread
            await asyncio.sleep(0.01)
        closing.cancel()
        closing.cancel()  # a second cancel (Ctrl-C twice) does not end the wait either
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert not server._thread.is_alive()  # the cancel went on only once the shop stopped
    finally:
        client.close()

"""Cancelling a coroutine parked on an HTTP request: OpenAPI tools, OpenAIPolicy, remote vLLM.

A real HTTP server on loopback holds each request open: it tells the test when the request
arrived, then reads the socket until the client goes away. So the tests cancel exactly while
the request is in flight and see, from the server's side, that the client dropped it (what
makes a vLLM server abort the generation).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentgym import OpenAIPolicy
from agentgym._openapi import openapi_tools
from tests.conftest import serve_in_thread


class HangingServer(ThreadingHTTPServer):
    """Answers no request; records each one's arrival and its client's hang-up."""

    daemon_threads = True

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.arrived = asyncio.Event()
        self.hung_up = threading.Event()
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _hold(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                server.paths.append(self.path)
                loop.call_soon_threadsafe(server.arrived.set)
                while self.rfile.read(1):  # b"": the client closed the connection
                    pass
                server.hung_up.set()

            do_GET = do_POST = do_PUT = _hold

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
async def server() -> Iterator[HangingServer]:
    s = HangingServer(asyncio.get_running_loop())
    serve_in_thread(s)
    yield s
    s.shutdown()
    s.server_close()


async def cancel_in_flight(server: HangingServer, coro) -> None:
    """Run ``coro``, cancel it once its request reached ``server``; it must raise Cancelled."""
    task = asyncio.ensure_future(coro)
    await server.arrived.wait()
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(server.hung_up.wait, 30), "the request was left open"


DOC = {
    "openapi": "3.0.0",
    "paths": {"/pets": {"get": {"operationId": "list_pets", "responses": {"200": {}}}}},
}


async def test_an_openapi_call_cancelled_in_flight_closes_its_own_client(server) -> None:
    [tool] = openapi_tools(DOC, server.url, timeout=120)
    await cancel_in_flight(server, tool.acall({}))
    assert server.paths == ["/pets"]


async def test_an_openapi_call_cancelled_in_flight_drops_the_request_of_a_given_client(
    server,
) -> None:
    import httpx

    async with httpx.AsyncClient() as client:
        [tool] = openapi_tools(DOC, server.url, client=lambda env: client, timeout=120)
        await cancel_in_flight(server, tool.acall({}))


async def test_an_openai_policy_turn_cancelled_in_flight_is_cancelled_not_a_model_error(
    server,
) -> None:
    policy = OpenAIPolicy(server.url + "/v1", "m", timeout=120, max_retries=3)
    try:
        await cancel_in_flight(
            server, policy.generate([{"role": "user", "content": "hi"}], [], max_tokens=4)
        )
    finally:
        await policy.aclose()
    assert server.paths == ["/v1/chat/completions"]  # not retried


async def test_a_remote_vllm_turn_cancelled_in_flight_frees_its_replica_slot(server) -> None:
    from agentgym.engine import RemoteVLLMPolicy, VLLMFleet

    fleet = VLLMFleet([server.url], "tiny", timeout=120)
    policy = RemoteVLLMPolicy("unused-tokenizer", fleet, max_model_len=64)
    try:
        await cancel_in_flight(server, policy.generate_ids([1, 2, 3], max_tokens=4, session="s"))
        [replica] = fleet.router.replicas.values()
        assert replica.in_flight == 0, "the request is still counted on its server"
        assert server.paths == ["/v1/completions"]  # not retried on the same or another server
    finally:
        await policy.aclose()


async def test_a_cancelled_pool_close_leaves_no_closed_pool_to_hand_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpx marks its client closed before its transport closes: a close cancelled there
    kept the closed client, which `LoopClient.get` handed out (every request a RuntimeError)."""
    import httpx

    from agentgym._http import LoopClient

    pools = LoopClient()
    first = pools.get()
    closed = asyncio.Event()
    real_close = httpx.AsyncClient.aclose

    async def slow_close(self: httpx.AsyncClient) -> None:
        await real_close(self)
        closed.set()
        await asyncio.Event().wait()  # the transport's close, still running when cancelled

    monkeypatch.setattr(httpx.AsyncClient, "aclose", slow_close)
    closing = asyncio.create_task(pools.aclose())
    await asyncio.wait_for(closed.wait(), 5)
    closing.cancel()
    await asyncio.wait([closing])
    assert first.is_closed
    second = pools.get()
    assert second is not first and not second.is_closed

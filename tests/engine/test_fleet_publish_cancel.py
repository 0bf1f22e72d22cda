"""A publish cancelled while the servers load the adapter (real HTTP on loopback).

Once the cancelled publish has returned, the version the fleet samples with must be one every
server serves, and every adapter of the run a server holds must be one the fleet keeps (it
unloads those; a version it never recorded stays on the server, holding a ``--max-loras``
slot). And the next publish must really load its weights: had the number been reused, a
server still holding the cancelled version would skip the load as "served already" and
sample old weights under the new version's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response

from agentgym.engine import RemoteVLLMPolicy, VLLMFleet
from agentgym.serve._thread import serve_in_thread
from tests.conftest import require
from tests.engine.fault_server import FaultServer

PROMPT = [1, 2, 3, 4]


class HeldLoadServer(FaultServer):
    """A stand-in that applies an adapter load at once and, with ``hold``, holds its answer.

    As vLLM does: a load the server has started ends on the server whatever its client does,
    so a cancelled publish meets servers that serve the version already.
    """

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.loaded = threading.Event()  # a load is applied (a held one: its answer waits)
        self.release = threading.Event()

    def app(self) -> FastAPI:
        app = super().app()

        @app.middleware("http")
        async def held(request: Request, call_next: Any) -> Response:
            response: Response = await call_next(request)
            if request.url.path == "/v1/load_lora_adapter":
                self.loaded.set()
                if self.hold:
                    await asyncio.to_thread(self.release.wait)
            return response

        return app


@pytest.fixture
def servers() -> Iterator[list[HeldLoadServer]]:
    """Two `HeldLoadServer`s on loopback; held answers go out before they stop."""
    require("fastapi")
    require("uvicorn")
    servers = [HeldLoadServer(), HeldLoadServer()]
    with contextlib.ExitStack() as stack:
        for server in servers:
            server.url = stack.enter_context(serve_in_thread(server.app()))
            stack.callback(server.release.set)
        yield servers


def run_adapters(server: FaultServer) -> set[str]:
    return server.served - {server.model}


async def test_a_publish_cancelled_mid_load_leaves_the_fleet_and_servers_agreeing(
    servers: list[HeldLoadServer], tiny_model_dir: Path, adapter: Path
) -> None:
    fast, slow = servers
    slow.hold = True  # its load is applied and its answer held: the cancel lands in between
    fleet = VLLMFleet([s.url for s in servers], "tiny", timeout=30.0, cool_off=3600)
    policy = RemoteVLLMPolicy(tiny_model_dir, fleet, sampling={"max_tokens": 8})
    publishing = asyncio.create_task(policy.aload_adapter(adapter, 1))
    for server in servers:  # the loads run concurrently: the fast one may end second
        assert await asyncio.to_thread(server.loaded.wait, 30)
    assert run_adapters(fast) == run_adapters(slow) == {"agentgym-v1"}
    publishing.cancel()
    slow.release.set()
    with pytest.raises(asyncio.CancelledError):
        await publishing

    kept = {a.name for a in policy.adapters}
    for server in servers:
        assert run_adapters(server) == kept, f"fleet keeps {kept}, a server serves {server.served}"
    turn = await policy.generate_ids(PROMPT, session="e")
    assert turn.adapter_version == policy.adapter_version
    assert fast.completions[-1]["model"] == fleet.served_name(policy.adapter_version)

    slow.hold = False
    await policy.aload_adapter(adapter)  # a fresh number, loaded everywhere (not skipped)
    assert [s.loads for s in servers] == [["agentgym-v1", "agentgym-v2"]] * 2
    assert all(run_adapters(s) == {a.name for a in policy.adapters} for s in servers)
    await policy.aclose()

"""ToolAPI-v0 episodes cancelled while the shop holds a tenant for them (real loopback HTTP).

The env's admin calls go through `AdminGate`, a real HTTP proxy in front of the real shop
that holds one answer where a test wants the cancel to land: after the shop created a tenant
but before the env read its name, or while the reward reads the episode's world. Whether the
tenant was left behind is asked of the shop itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response

from agentgym.serve._thread import serve_in_thread
from tests.conftest import require


class AdminGate:
    """A proxy for the shop's ``/admin`` routes that holds the first call of method ``held``.

    A call is held after the shop answered it (a ``POST``: the tenant exists, and the env has
    not read its name). ``created`` lists the tenants the shop made.
    """

    def __init__(self, shop: str, held: str) -> None:
        self.shop, self.held = shop, held
        self.created: list[str] = []
        self.holding = threading.Event()  # the held call is where the test wants it
        self.release = threading.Event()
        self.url = ""

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.api_route("/admin/tenants{rest:path}", methods=["GET", "POST", "DELETE"])
        async def admin(request: Request, rest: str) -> Response:
            held = request.method == self.held and not self.holding.is_set()
            headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
            async with httpx.AsyncClient() as client:
                answer = await client.request(
                    request.method, f"{self.shop}/admin/tenants{rest}", headers=headers
                )
            if request.method == "POST" and answer.status_code == 200:
                self.created.append(answer.json()["tenant"])
            if held:
                self.holding.set()
                await asyncio.to_thread(self.release.wait)
            return Response(answer.content, answer.status_code, media_type="application/json")

        return app


@pytest.fixture
def toolapi() -> Iterator[ModuleType]:
    """The env's module, its shop kept running for the whole test (checked after the env)."""
    require("fastapi")
    require("uvicorn")
    import agentgym.envs.toolapi as module

    shop = module.service.acquire()
    try:
        yield module
    finally:
        module.service.release(shop)


def gated_env(toolapi: ModuleType, held: str) -> tuple[Any, AdminGate]:
    """A ToolAPI env whose admin calls go through a fresh `AdminGate` (the tools do not)."""

    class GatedToolAPI(toolapi.ToolAPIEnv):  # type: ignore[name-defined]
        def _admin_url(self, path: str) -> str:
            return gate.url + path

    env = GatedToolAPI()
    gate = AdminGate(env.server.base_url, held)
    return env, gate


async def tenant_exists(toolapi: ModuleType, env: Any, tenant: str) -> bool:
    admin = {toolapi.service.ADMIN_HEADER: env.server.admin_token}
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"{env.server.base_url}/admin/tenants/{tenant}", headers=admin)
    assert answer.status_code in (200, 404), answer.text
    return answer.status_code == 200


async def test_a_setup_cancelled_as_the_shop_created_its_tenant_drops_that_tenant(
    toolapi: ModuleType,
) -> None:
    env, gate = gated_env(toolapi, held="POST")
    with serve_in_thread(gate.app()) as gate.url:
        try:
            resetting = asyncio.create_task(env.areset(options={"task": 0}))
            assert await asyncio.to_thread(gate.holding.wait, 30)  # the tenant exists now
            resetting.cancel()
            gate.release.set()
            with pytest.raises(asyncio.CancelledError):
                await resetting
            await env.aclose()  # what a rollout does with an env whose episode was cancelled
        finally:
            gate.release.set()
    [tenant] = gate.created
    assert not await tenant_exists(toolapi, env, tenant), "the cancelled episode's tenant leaked"


async def test_an_episode_cancelled_after_it_was_marked_done_still_drops_its_tenant(
    toolapi: ModuleType,
) -> None:
    """Guard, not a leak: `ToolEnv._finish` marks the episode done, then scores it, then tears
    it down, so `aclose` never retries that teardown. A cancel while the reward reads the shop
    still drops the tenant: the teardown runs in ``_finish``'s ``finally``, before the cancel
    goes on (and ToolAPI's drop is shielded against a cancel inside the teardown itself:
    ``test_a_teardown_cancelled_midway_still_drops_its_tenant`` in ``test_toolapi.py``)."""
    env, gate = gated_env(toolapi, held="GET")
    with serve_in_thread(gate.app()) as gate.url:
        try:
            await env.areset(options={"task": 0})
            tenant = env._tenant
            ending = asyncio.create_task(env.atruncate())  # scored, then torn down
            assert await asyncio.to_thread(gate.holding.wait, 30)  # the reward reads the shop
            assert env.state.done
            ending.cancel()
            gate.release.set()
            with pytest.raises(asyncio.CancelledError):
                await ending
            assert not await tenant_exists(toolapi, env, tenant)
        finally:
            gate.release.set()
            await env.aclose()

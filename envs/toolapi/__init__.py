"""ToolAPI: serve a customer of an online shop through the shop's real HTTP API.

Why: agents in production call services, not Python functions, and the policy being trained
must not be able to talk its way to a reward. Here the tools are generated from the running
service's OpenAPI document (`agentgym._openapi.openapi_tools`), the service enforces its own
business rules, and the reward reads the episode's database afterwards: 1 when exactly the
expected rows changed and no rule-breaking write was attempted, else 0. A service failure
(refused connection, HTTP 5xx, timeout) is ``infra_error``, never a reward, unless the shop
still answers `PROBE` for the episode: then the model's arguments broke that call, and the
failure is a tool error it reads (so breaking the shop is no way out of a low reward).

One `service.ShopServer` (uvicorn in a thread, 127.0.0.1, free port) serves every env of the
process; each episode gets its own tenant, created on reset and dropped when it ends.
"""

from __future__ import annotations

import contextlib
from typing import Any

import httpx

from agentgym import InfraError, Rubric, ToolCall, ToolEnv
from agentgym._openapi import openapi_tools

try:
    from . import service
except ImportError as exc:  # pragma: no cover - the 'tools' extra is missing
    raise ImportError(
        f"agentgym/ToolAPI-v0 needs fastapi and uvicorn ({exc}); pip install 'agentgym[tools]'"
    ) from exc
from .tasks import Split, changes, make_tasks, seed_state

PROBE = "/products"
"""What a working shop answers for any episode: a failed call was the model's doing if the
shop still answers this (`agentgym._openapi.openapi_tools`'s ``probe``)."""


async def expected_state(env: ToolAPIEnv, task: dict[str, Any]) -> float:
    """1 if the rows that changed are exactly ``task["expected"]`` and no rule was broken."""
    world = await env.read_world()
    return float(
        not world["violations"] and changes(seed_state(), world["state"]) == task["expected"]
    )


async def rule_violations(env: ToolAPIEnv) -> float:
    """Metric only (weight 0): how many writes the service refused as rule-breaking."""
    return float(len((await env.read_world())["violations"]))


class ToolAPIEnv(ToolEnv):
    """Fulfil a shop customer's request (refund, cancel, change an order or an address).

    Args:
        split: ``train`` (36 tasks, customers C101-C112) or ``eval`` (12, C113-C116).
        http_timeout: seconds one call to the service may take before it is an infra error.
        kwargs: any `ToolEnv` option (``parser``, ``max_turns`` ...).
    """

    def __init__(self, split: Split = "train", http_timeout: float = 30.0, **kwargs: Any) -> None:
        tasks = make_tasks(split)
        kwargs.setdefault("max_turns", 8)
        kwargs.setdefault(
            "system_prompt",
            "You are a customer-service agent of an online shop. Use the tools to look up the "
            "customer and their orders, then do exactly what they ask, within the shop's rules. "
            "Reply briefly when done.",
        )
        self.server = service.acquire()
        self._released = False
        self.http_timeout = http_timeout
        self._http: httpx.AsyncClient | None = None
        self._tenant = ""
        try:
            tools = openapi_tools(
                self.server.openapi,
                self.server.base_url,
                client=self._client,
                timeout=http_timeout,
                probe=PROBE,
            )
            super().__init__(
                tools,
                tasks=tasks,
                rubric=Rubric([expected_state, rule_violations], weights=[1.0, 0.0]),
                **kwargs,
            )
        except BaseException:
            service.release(self.server)
            raise

    @staticmethod
    def _client(env: ToolAPIEnv) -> httpx.AsyncClient:
        if env._http is None:
            raise InfraError("the episode has no connection to the shop (reset first)")
        return env._http

    async def setup_episode(self, task: dict[str, Any]) -> None:
        self._http = httpx.AsyncClient(timeout=self.http_timeout)
        created = await self._admin("POST", "/admin/tenants")
        self._tenant = created["tenant"]
        self._http.headers[service.TENANT_HEADER] = self._tenant

    async def teardown_episode(self) -> None:
        http, self._http = self._http, None
        if http is None:
            return
        try:
            with contextlib.suppress(httpx.HTTPError):  # a dead service has nothing to drop
                if self._tenant:
                    await http.delete(
                        self._admin_url(f"/admin/tenants/{self._tenant}"),
                        headers={service.ADMIN_HEADER: self.server.admin_token},
                    )
        finally:
            self._tenant = ""
            await http.aclose()

    async def read_world(self) -> dict[str, Any]:
        """The episode's database rows and rule violations, read from the service."""
        return await self._admin("GET", f"/admin/tenants/{self._tenant}")

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            if not self._released:
                self._released = True
                service.release(self.server)

    def reference_turns(self, task: dict[str, Any]) -> list[str]:
        calls = [self.parser.render("", [ToolCall(name, args)]) for name, args in task["calls"]]
        return [*calls, "Done: your request has been taken care of."]

    def _admin_url(self, path: str) -> str:
        return self.server.base_url + path

    async def _admin(self, method: str, path: str) -> dict[str, Any]:
        """An admin call; any failure is the service's (an `InfraError`), never the model's."""
        if self._http is None:
            raise InfraError("the episode has no connection to the shop (reset first)")
        try:
            response = await self._http.request(
                method,
                self._admin_url(path),
                headers={service.ADMIN_HEADER: self.server.admin_token},
            )
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise InfraError(f"the shop service failed: {type(exc).__name__}: {exc}") from exc
        result: dict[str, Any] = response.json()
        return result

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

import asyncio
import contextlib
import math
from typing import Any

import httpx

from agentgym import ConfigError, InfraError, Rubric, Tool, ToolCall, ToolEnv
from agentgym._openapi import openapi_tools
from agentgym._run_to_end import run_to_end

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


def _check_timeouts(http_timeout: float, tool_timeout: Any) -> None:
    """Refuse an ``http_timeout`` that is not a finite number of seconds > 0, or a tool timeout.

    Why: the error came from the generated tools and named ``timeout``, an option the env
    does not have; an infinite one let a hung shop hold an episode forever (the generated
    tools have no timeout of their own); and a ``tool_timeout`` ended a slow call before the
    probe could blame the shop, so a hung shop scored 0 as the model's tool error.
    """
    number = isinstance(http_timeout, (int, float)) and not isinstance(http_timeout, bool)
    if not (number and math.isfinite(http_timeout) and http_timeout > 0):
        raise ConfigError(
            f"http_timeout must be a finite number of seconds > 0, got {http_timeout!r}"
        )
    if tool_timeout is not None:
        raise ConfigError(
            "ToolAPI-v0 times its calls with http_timeout, and blames a timeout on the shop "
            "when the shop also fails its probe; tool_timeout would cut that short and score "
            "a hung shop 0: pass http_timeout= instead"
        )


class ToolAPIEnv(ToolEnv):
    """Fulfil a shop customer's request (refund, cancel, change an order or an address).

    Args:
        split: ``train`` (36 tasks, customers C101-C112) or ``eval`` (12, C113-C116).
        http_timeout: seconds one call to the service may take before it has failed (then
            an infra error, unless the shop still answers its probe).
        kwargs: any `ToolEnv` option (``parser``, ``max_turns`` ...) but ``tool_timeout``.
    """

    def __init__(self, split: Split = "train", http_timeout: float = 30.0, **kwargs: Any) -> None:
        tasks = make_tasks(split)
        _check_timeouts(http_timeout, kwargs.get("tool_timeout"))
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
            super().__init__(
                self._shop_tools(self.server),
                tasks=tasks,
                rubric=Rubric([expected_state, rule_violations], weights=[1.0, 0.0]),
                **kwargs,
            )
        except BaseException:
            service.release(self.server)
            raise

    def _shop_tools(self, server: service.ShopServer) -> list[Tool]:
        """The tools made from ``server``'s OpenAPI document, sending their calls to it."""
        return openapi_tools(
            server.openapi,
            server.base_url,
            client=self._client,
            timeout=self.http_timeout,
            probe=PROBE,
        )

    def _reacquire_shop(self) -> None:
        """Take the shop again after `aclose` gave it back, so a closed env resets as others do.

        Why: the last env to give the shared shop back stops it, and a reset after `close`
        then spoke to a stopped server: an `InfraError`, so a rollout dropped the episode.
        A shop started anew listens on another port, so the tools are made again for it.
        """
        server = service.acquire()
        try:
            tools = None if server is self.server else self._shop_tools(server)
        except BaseException:
            service.release(server)
            raise
        self.server, self._released = server, False
        if tools is not None:
            self.tools = {t.name: t for t in tools}

    @staticmethod
    def _client(env: ToolAPIEnv) -> httpx.AsyncClient:
        if env._http is None:
            raise InfraError("the episode has no connection to the shop (reset first)")
        return env._http

    async def setup_episode(self, task: dict[str, Any]) -> None:
        if self._released:
            self._reacquire_shop()
        self._http = httpx.AsyncClient(timeout=self.http_timeout)
        # the shop makes the tenant whatever this side does: a cancel that cut its answer short
        # left a tenant nobody knew the name of, so no teardown ever dropped it. Once the
        # answer is in, the name is kept, and the teardown drops it
        await run_to_end(self._create_tenant(self._http))

    async def _create_tenant(self, http: httpx.AsyncClient) -> None:
        created = await self._admin("POST", "/admin/tenants")
        self._tenant = created["tenant"]
        http.headers[service.TENANT_HEADER] = self._tenant

    async def teardown_episode(self) -> None:
        http, self._http = self._http, None
        tenant, self._tenant = self._tenant, ""
        if http is not None:
            # shielded: an episode cancelled while it ended (a deadline, Ctrl-C) left its
            # tenant in the shared service, and the env never tries that teardown again
            await asyncio.shield(self._drop_tenant(http, tenant))

    async def _drop_tenant(self, http: httpx.AsyncClient, tenant: str) -> None:
        try:
            with contextlib.suppress(httpx.HTTPError):  # a dead service has nothing to drop
                if tenant:
                    await http.delete(
                        self._admin_url(f"/admin/tenants/{tenant}"),
                        headers={service.ADMIN_HEADER: self.server.admin_token},
                    )
        finally:
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
                if service.give_back(self.server):  # the last env stops the shop, in a thread:
                    # the stop waits for its thread (about 2 s with a request arriving), and on
                    # the event loop every other episode stood still meanwhile. Run to its end
                    # even when cancelled: the shop is stopped before the cancel goes on
                    await run_to_end(asyncio.to_thread(self.server.stop))

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
        except httpx.TimeoutException as exc:  # its message is often empty
            raise InfraError(
                f"the shop did not answer {method} {path} within http_timeout="
                f"{self.http_timeout:g} s; raise http_timeout if the machine is busy"
            ) from exc
        except httpx.HTTPError as exc:
            raise InfraError(f"the shop service failed: {type(exc).__name__}: {exc}") from exc
        result: dict[str, Any] = response.json()
        return result

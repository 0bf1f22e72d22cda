"""A new user's journey through the ToolAPI env: its timeouts, and cancellation.

Three tests pin defects the journey found: an ``http_timeout`` error that named an option
the env does not have, and accepted infinity; a timed-out tenant call reported as
"ConnectTimeout: " with nothing after it; a ``tool_timeout`` that turned a hung shop into the
model's tool error. One pins that an episode cancelled while the model is thinking still
drops its tenant.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
import pytest

import agentgym
from agentgym import Completion, ConfigError, ScriptedPolicy
from tests.conftest import hermes_call as call
from tests.conftest import require


@pytest.fixture(scope="module")
def service() -> Any:
    require("fastapi")
    require("uvicorn")
    from agentgym.envs.toolapi import service

    return service


@pytest.mark.parametrize("http_timeout", [0, -1.0, math.inf, math.nan])
def test_an_http_timeout_that_is_no_finite_positive_number_names_http_timeout(
    service: Any, http_timeout: float
) -> None:
    # Before: "timeout must be ..." (the tools' option, not the env's), and inf was accepted.
    with pytest.raises(ConfigError, match=r"^http_timeout must be a finite number of seconds"):
        agentgym.make("toolapi", http_timeout=http_timeout)


def test_a_tenant_call_that_times_out_names_http_timeout(service: Any) -> None:
    # Before: "the shop service failed: ConnectTimeout: " (httpx's message is empty).
    [t] = agentgym.rollout(
        "toolapi", ScriptedPolicy(["Done."]), tasks=[0], env_kwargs={"http_timeout": 1e-9}
    )
    assert t.status == "infra_error"
    assert "did not answer POST /admin/tenants within http_timeout=1e-09 s" in t.error, t.error


class _CancelOnSecondTurn:
    """Cancels an order, then waits forever on its second turn, after saying so."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.tenant = ""

    async def generate(self, messages: list[dict[str, Any]], tools: Any, **_: Any) -> Completion:
        if not any(m["role"] == "assistant" for m in messages):
            text = call("cancel_order", order_id="O1002", reason="no_longer_needed")
            return Completion(text=text, finish_reason="stop")
        self.waiting.set()
        await asyncio.Event().wait()
        raise AssertionError("never reached")


def test_an_episode_cancelled_mid_way_drops_its_tenant(service: Any) -> None:
    policy = _CancelOnSecondTurn()
    keeper = agentgym.make("toolapi")  # keeps the shop up once the rollout closes its env
    played = agentgym.make("toolapi")

    async def cancel_mid_episode() -> str:
        task = asyncio.create_task(agentgym.arollout(lambda: played, policy, tasks=[0]))
        await policy.waiting.wait()
        tenant = played.unwrapped._tenant
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return tenant

    try:
        tenant = asyncio.run(cancel_mid_episode())
        assert tenant
        server = keeper.unwrapped.server
        answer = httpx.get(
            f"{server.base_url}/admin/tenants/{tenant}",
            headers={service.ADMIN_HEADER: server.admin_token},
        )
    finally:
        played.close()
        keeper.close()
    assert answer.status_code == 404, answer.text


def test_tool_timeout_is_refused_for_http_timeout(service: Any) -> None:
    # Before: accepted; it overrode the generated tools' timing, so a slow or hung shop ended
    # each call as the model's "timed out" tool error, scored 0 instead of infra_error.
    with pytest.raises(ConfigError, match="tool_timeout would cut that short.*http_timeout="):
        agentgym.make("toolapi", tool_timeout=5)

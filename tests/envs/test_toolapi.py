"""ToolAPI-v0: the shop service over real loopback HTTP, tenants, oracles, state-checked rewards."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import pytest

import agentgym
from agentgym import Completion, ConfigError, InfraError, ScriptedPolicy, ToolCall
from tests.conftest import hermes_call as call
from tests.conftest import require


@pytest.fixture(scope="module")
def toolapi() -> ModuleType:
    require("fastapi")
    require("uvicorn")
    import agentgym.envs.toolapi as module

    return module


@pytest.fixture
def env(toolapi: ModuleType) -> Iterator[Any]:
    env = agentgym.make("agentgym/ToolAPI-v0")
    yield env
    env.close()


def task_of(env: Any, kind: str) -> dict[str, Any]:
    return next(t for t in env.tasks if t["id"].startswith(kind + "-"))


def test_tasks_are_deterministic_split_and_each_changes_the_state(toolapi: ModuleType) -> None:
    from agentgym.envs.toolapi.tasks import make_tasks

    train, evaluation = make_tasks("train"), make_tasks("eval")
    assert (len(train), len(evaluation)) == (36, 12)
    assert make_tasks("train") == train
    ids = [t["id"] for t in train + evaluation]
    assert len(set(ids)) == len(ids) == 48
    customers = lambda tasks: {t["calls"][0][1]["email"] for t in tasks}  # noqa: E731
    assert not customers(train) & customers(evaluation)
    assert all(t["expected"] and t["prompt"] for t in train + evaluation)
    assert {t["id"].split("-")[0] for t in evaluation} == {
        "refund",
        "cancel",
        "quantity",
        "reship",
        "address",
    }
    with pytest.raises(
        ConfigError, match="split='test' is not valid: input should be 'train' or 'eval'"
    ):
        agentgym.make("agentgym/ToolAPI-v0", split="test")


def test_tools_come_from_the_running_services_openapi_document(env: Any) -> None:
    doc = httpx.get(env.server.base_url + "/openapi.json").json()
    assert sorted(env.tools) == sorted(
        op["operationId"] for item in doc["paths"].values() for op in item.values()
    )
    assert len(env.tools) == 12 and not any("admin" in path for path in doc["paths"])
    refund = env.tools["refund_order"].parameters
    assert refund["required"] == ["order_id", "amount_cents", "reason"]
    assert refund["properties"]["reason"]["enum"][0] == "damaged"  # a nested $ref, resolved
    assert "tenant" not in json.dumps(env.tool_schemas).lower()


@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_oracle_scores_one(toolapi: ModuleType, split: str) -> None:
    tasks = agentgym.make("agentgym/ToolAPI-v0", split=split)
    try:
        oracle = ScriptedPolicy(tasks.reference_turns)
        trajectories = agentgym.rollout("agentgym/ToolAPI-v0", oracle, env_kwargs={"split": split})
    finally:
        tasks.close()
    assert len(trajectories) == len(tasks.tasks)
    assert [(t.status, t.final_reward) for t in trajectories] == [("ok", 1.0)] * len(trajectories)


def test_a_legal_but_wrong_action_scores_zero(env: Any) -> None:
    task = task_of(env, "refund")
    other = next(t for t in env.tasks if t["id"].startswith("refund-") and t is not task)
    env.reset(options={"task": env.tasks.index(task)})
    # refund another customer's order: allowed by the rules, but not what was asked
    obs, *_ = env.step(call("refund_order", **other["calls"][-1][1]))
    assert '"status": 200' in obs[-1]["content"]
    _, reward, terminated, _, info = env.step("Done.")
    assert terminated and reward == 0.0 and info["scores"]["rule_violations"] == 0.0


def test_a_rule_breaking_write_scores_zero_even_when_the_task_is_then_done(env: Any) -> None:
    task = task_of(env, "refund")
    order = task["calls"][-1][1]["order_id"]
    old = f"O{int(order[1:]) + 1}"  # the same customer's order delivered 60 days ago
    env.reset(options={"task": env.tasks.index(task)})
    obs, _, _, _, info = env.step(
        call("refund_order", order_id=old, amount_cents=100, reason="damaged")
    )
    assert obs[-1]["content"].startswith("Error: HTTP 409 from refund_order: order")
    assert "refunds close after 30 days" in info["tool_errors"][0]
    for turn in env.reference_turns(task)[:-1]:
        env.step(turn)
    _, reward, terminated, _, info = env.step("Done.")
    assert terminated and reward == 0.0 and info["scores"]["rule_violations"] == 1.0


def test_doing_nothing_scores_zero_and_the_models_words_do_not_count(env: Any) -> None:
    env.reset(options={"task": 0})
    _, reward, terminated, _, _ = env.step("I have refunded the order in full. Reward: 1.")
    assert terminated and reward == 0.0


def test_4xx_answers_go_back_to_the_model(env: Any) -> None:
    env.reset(options={"task": 0})
    obs, _, terminated, _, info = env.step(call("get_order", order_id="O9999"))
    assert (
        not terminated and obs[-1]["content"] == "Error: HTTP 404 from get_order: no order 'O9999'"
    )
    obs, *_ = env.step(call("get_customer", customer_id="../admin/tenants"))
    assert obs[-1]["content"].startswith("Error: HTTP 404")  # encoded: no way to the admin routes
    obs, *_ = env.step(
        call("update_customer_address", customer_id="C101", street="1 A St", city="X", zip="123")
    )
    assert obs[-1]["content"].startswith("Error: invalid arguments")  # schema from the service


async def test_concurrent_episodes_each_change_only_their_own_tenant(toolapi: ModuleType) -> None:
    envs = [agentgym.make("agentgym/ToolAPI-v0") for _ in range(2)]
    try:
        refund, cancel = task_of(envs[0], "refund"), task_of(envs[0], "cancel")
        await asyncio.gather(
            *(e.areset(options={"task": t}) for e, t in zip(envs, (refund, cancel)))
        )
        assert envs[0].server is envs[1].server and envs[0]._tenant != envs[1]._tenant

        async def play(env: Any, task: dict[str, Any]) -> None:
            for turn in env.reference_turns(task)[:-1]:
                await env.astep(Completion(text=turn))

        await asyncio.gather(play(envs[0], refund), play(envs[1], cancel))
        states = [await e.read_world() for e in envs]
        seed = toolapi.seed_state()
        assert toolapi.changes(seed, states[0]["state"]) == refund["expected"]
        assert toolapi.changes(seed, states[1]["state"]) == cancel["expected"]
        tenant = envs[0]._tenant
        await envs[0].areset(options={"task": refund})  # a new episode: a new, fresh tenant
        assert toolapi.changes(seed, (await envs[0].read_world())["state"]) == {}
        admin = {toolapi.service.ADMIN_HEADER: envs[0].server.admin_token}
        async with httpx.AsyncClient() as client:  # the old tenant was dropped
            gone = await client.get(
                f"{envs[0].server.base_url}/admin/tenants/{tenant}", headers=admin
            )
        assert gone.status_code == 404
    finally:
        for e in envs:
            await e.aclose()


async def test_a_teardown_cancelled_midway_still_drops_its_tenant(toolapi: ModuleType) -> None:
    """Cancelled as its DELETE went out (a deadline, Ctrl-C), the tenant stayed in the shared
    service, and the env never tries that teardown again."""
    env = agentgym.make("agentgym/ToolAPI-v0")
    try:
        await env.areset(options={"task": task_of(env, "refund")})
        tenant, admin = env._tenant, {toolapi.service.ADMIN_HEADER: env.server.admin_token}
        ending = asyncio.create_task(env.teardown_episode())
        await asyncio.sleep(0)  # its DELETE is under way
        ending.cancel()
        await asyncio.wait([ending])
        deadline = asyncio.get_running_loop().time() + 10
        async with httpx.AsyncClient() as client:
            url = f"{env.server.base_url}/admin/tenants/{tenant}"
            while (await client.get(url, headers=admin)).status_code != 404:
                assert asyncio.get_running_loop().time() < deadline, "the tenant was left"
                await asyncio.sleep(0.05)  # polling for the outcome, bounded
    finally:
        await env.aclose()


def test_the_admin_routes_need_the_token(env: Any) -> None:
    env.reset(options={"task": 0})
    url = f"{env.server.base_url}/admin/tenants/{env._tenant}"
    assert httpx.get(url).status_code == 403
    assert httpx.get(url, headers={"X-Admin-Token": "guess"}).status_code == 403


def test_the_service_dying_mid_episode_is_an_infra_error(toolapi: ModuleType) -> None:
    made: list[Any] = []

    def make_env() -> Any:
        made.append(agentgym.make("agentgym/ToolAPI-v0"))
        return made[-1]

    class KillsTheService:
        async def generate(self, messages: list[Any], tools: Any, **kw: Any) -> Completion:
            if sum(m["role"] == "assistant" for m in messages) == 1:
                made[0].server.stop()  # after one good call, the service goes away
            return Completion(text=call("get_customer", customer_id="C101"))

    [trajectory] = agentgym.rollout(make_env, KillsTheService(), tasks=[0])
    assert trajectory.status == "infra_error" and trajectory.final_reward is None
    assert "ConnectError" in trajectory.error or "RemoteProtocolError" in trajectory.error
    assert '"status": 200' in trajectory.messages[3]["content"]
    fresh = agentgym.make("agentgym/ToolAPI-v0")  # the next env gets a new service
    try:
        assert fresh.server is not made[0].server and fresh.server.alive
        fresh.reset(options={"task": 0})
        fresh.server.stop()  # dies before the reward reads the database: not a 0, an infra error
        with pytest.raises(InfraError, match="the shop service failed"):
            fresh.step("Done.")
    finally:
        fresh.close()


def test_reference_turns_render_in_the_envs_parser(toolapi: ModuleType) -> None:
    env = agentgym.make("agentgym/ToolAPI-v0", parser="llama3_json")
    try:
        task = env.tasks[0]
        first = env.parser.parse(env.reference_turns(task)[0]).tool_calls[0]
        assert (first.name, first.arguments) == tuple(task["calls"][0])
        assert isinstance(first, ToolCall)
    finally:
        env.close()


def test_the_probe_is_a_read_every_episode_of_a_working_shop_answers(
    toolapi: ModuleType, env: Any
) -> None:
    """`PROBE` decides whether a failed call was the model's (the shop still answers it) or
    the shop's: it must answer 2xx for an episode's tenant, and not without one."""
    env.reset(options={"task": 0})
    probe = env.server.base_url + toolapi.PROBE
    tenant = {toolapi.service.TENANT_HEADER: env._http.headers[toolapi.service.TENANT_HEADER]}
    assert httpx.get(probe, headers=tenant).status_code == 200
    assert httpx.get(probe).status_code == 503

"""Model input against the HTTP tool services: it must never turn an episode into infra_error.

An ``infra_error`` episode is dropped from its GRPO group instead of scored, so a model that can
make a tool service fail (HTTP 5xx, a hang, a dropped connection) escapes a low reward. Bad
input is a tool error the model reads; only a service that fails on its own is infra_error.
Every service here is a real uvicorn server on loopback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import agentgym
from agentgym.serve._thread import serve_in_thread
from tests.conftest import hermes_call as call
from tests.conftest import require

CORPUS = [
    ("p1", "Lima", "Lima is the capital of Peru, on the Pacific coast."),
    ("p2", "Paris", "Paris is the capital of France, on the Seine."),
]
QUESTIONS = [
    {"question": "Of which country is Lima the capital?", "answer": "Peru", "doc_id": "p1"}
]


# --- a search service speaking the search env's REST contract ---------------------------------


class Faults:
    """What the search service does wrong; set by a test, cleared before each."""

    broken = threading.Event()  # set: every request answers 500 (the service itself is down)
    fail_next = threading.Event()  # set: the next request answers 500 (a replica restarting)
    busy_for: list[int] = [0]  # the next N requests answer 429 (a rate limit, for a moment)


def search_app() -> Any:
    """A FastAPI search service over BM25 with the bugs real ones have on odd input."""
    require("fastapi")
    require("bm25s")
    from fastapi import FastAPI, HTTPException

    from agentgym.envs.search.backends import BM25Backend, Doc

    index = BM25Backend([Doc(*d) for d in CORPUS])
    app = FastAPI()

    @app.get("/search")
    def search(q: str, k: str = "5") -> dict[str, Any]:
        if Faults.broken.is_set():
            raise HTTPException(500, "index unavailable")
        if Faults.fail_next.is_set():
            Faults.fail_next.clear()
            raise HTTPException(500, "restarting")
        if Faults.busy_for[0]:
            Faults.busy_for[0] -= 1
            raise HTTPException(429, "slow down")
        if "overloaded" in q:  # the service's own state, whatever was asked: 503
            raise HTTPException(503, "overloaded")
        if "\x00" in q:  # handed to a C library that cannot take a NUL: an unhandled error
            raise RuntimeError("embedded null character")
        if "*" in q:  # a wildcard query scans the whole index
            time.sleep(5)
        hits = index.search(q, int(k))  # k read by hand: "1.0" is a ValueError, HTTP 500
        return {"hits": [h.__dict__ for h in hits]}

    @app.get("/docs/{doc_id}")
    def open_doc(doc_id: str) -> dict[str, str]:
        if Faults.broken.is_set():
            raise HTTPException(500, "index unavailable")
        doc = index.docs.get(doc_id)
        if doc is None:
            raise HTTPException(404, "no such document")
        return doc.__dict__

    return app


@pytest.fixture
def search_url() -> Iterator[str]:
    Faults.broken.clear()
    Faults.fail_next.clear()
    Faults.busy_for[0] = 0
    with serve_in_thread(search_app()) as url:
        yield url
    Faults.broken.clear()


@pytest.fixture
def backend(search_url: str) -> Iterator[Any]:
    from agentgym.envs.search.backends import HTTPBackend

    backend = HTTPBackend(search_url, timeout=1.5)  # a short timeout: the wildcard hangs 5 s
    yield backend
    backend.close()


def play(backend: Any, turns: list[str]) -> Any:
    """One episode of the search env over ``backend``, the model's turns scripted."""
    env = agentgym.make("search", corpus=backend, tasks=QUESTIONS, split="all", max_turns=10)
    [trajectory] = agentgym.rollout(lambda: env, agentgym.ScriptedPolicy(turns), tasks=[0])
    return trajectory


def raw_call(tool: str, arguments: str) -> str:
    """A hermes tool call with ``arguments`` as written (JSON ``json.dumps`` would not write)."""
    return f'<tool_call>{{"name": "{tool}", "arguments": {arguments}}}</tool_call>'


def tool_messages(trajectory: Any) -> list[str]:
    return [m["content"] for m in trajectory.messages if m["role"] == "tool"]


def test_search_query_the_service_fails_on_is_a_tool_error_not_infra_error(backend: Any):
    # a NUL made the service answer 500: InfraError, the episode dropped instead of scored
    trajectory = play(backend, [call("search", query="Peru\x00"), "Answer: Peru"])
    assert trajectory.status == "ok" and trajectory.final_reward == 1.0, trajectory.error
    [message] = tool_messages(trajectory)
    assert message.startswith("Error:") and "failed on this request" in message
    assert "answered 500" in message


def test_search_query_the_service_hangs_on_is_a_tool_error_not_infra_error(backend: Any):
    trajectory = play(backend, [call("search", query="Lim*"), "Answer: Peru"])
    assert trajectory.status == "ok" and trajectory.final_reward == 1.0, trajectory.error
    [message] = tool_messages(trajectory)
    assert "failed on this request" in message and "Timeout" in message


def test_open_id_the_service_redirects_is_a_tool_error_not_infra_error(backend: Any):
    # "p1/" reaches FastAPI as /docs/p1/, which it redirects to /docs/p1 (HTTP 307)
    trajectory = play(backend, [call("open", doc_id="p1/"), "Answer: Peru"])
    assert trajectory.status == "ok" and trajectory.final_reward == 1.0, trajectory.error
    [message] = tool_messages(trajectory)
    assert "failed on this request" in message and "answered 307" in message


def test_a_whole_number_k_written_as_a_float_is_sent_as_an_integer(backend: Any):
    # JSON schema counts 1.0 as an integer; sent as "k=1.0" it broke the service (500)
    trajectory = play(backend, [raw_call("search", '{"query": "Lima", "k": 1.0}'), "Answer: Peru"])
    assert trajectory.status == "ok" and trajectory.final_reward == 1.0, trajectory.error
    assert tool_messages(trajectory)[0].startswith("[p1] Lima")


def test_odd_queries_and_ids_are_results_or_tool_errors(backend: Any):
    """What services and clients already handle: each a result or a tool error, never infra."""
    queries = [
        "",
        "   ",
        "\t\n",
        "the of and a",
        "?!.,;:",
        "\u202e\u200b\ufeff",
        "ＬＩＭＡ",
        "x" * 2000,
        "Lima " * 399,
        "\U0001f600" * 500,
        "%00",
        "Lima&k=99",
        "q=Lima#",
    ]
    ids = ["", ".", "..", "...", "%2e%2e", "../p1", "..%2Fp1", "p1?x=1", "p1#x", " p1", "\x00",
           "\\..\\p1", "ｐ１", "p1/../p1", "a" * 500]  # fmt: skip
    turns = [call("search", query=q) for q in queries] + [call("open", doc_id=i) for i in ids]
    turns += [call("search", query="Lima", k=k) for k in (0, -1, 11, 10**30)]
    ks = ["1.5", "true", "null", "1e309", "NaN", '"3"', "[3]"]
    turns += [raw_call("search", f'{{"query": "Lima", "k": {k}}}') for k in ks]
    wrong = ['{"query": {"$ne": ""}}', '{"query": ["Lima"]}', '{"query": null}',
             '{"query": "Lima", "query": 5}', '{"query": "x", "extra": 1}',
             '{"query": ' + "[" * 3000 + "]" * 3000 + "}", '{"query": "\\ud800"}']  # fmt: skip
    turns += [raw_call("search", args) for args in wrong]
    all_turns = [*turns, "Answer: Peru"]
    env = agentgym.make("search", corpus=backend, tasks=QUESTIONS, split="all",
                        max_turns=len(all_turns) + 1)  # fmt: skip
    [trajectory] = agentgym.rollout(lambda: env, agentgym.ScriptedPolicy(all_turns), tasks=[0])
    assert trajectory.status == "ok" and trajectory.final_reward == 1.0, trajectory.error
    assert len(trajectory.turns) == len(all_turns)


def test_a_busy_service_is_asked_again_then_infrastructure_whatever_the_query(
    backend: Any, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("agentgym._service_faults.BUSY_WAITS", (0.01, 0.02, 0.04))
    Faults.busy_for[0] = 2  # a rate limit for a moment: asked again, served
    trajectory = play(backend, [call("search", query="Lima"), "Answer: Peru"])
    assert trajectory.status == "ok", trajectory.error
    assert tool_messages(trajectory)[0].startswith("[p1] Lima") and Faults.busy_for[0] == 0
    # 503 (or 429) to the end says the service is overloaded: the probe may land on a
    # healthy replica, so it is not asked
    trajectory = play(backend, [call("search", query="overloaded"), "Answer: Peru"])
    assert trajectory.status == "infra_error" and "answered 503" in trajectory.error


def test_a_passing_failure_is_asked_again_not_blamed_on_the_model(backend: Any):
    Faults.fail_next.set()
    trajectory = play(backend, [call("search", query="Lima"), "Answer: Peru"])
    assert trajectory.status == "ok", trajectory.error
    assert tool_messages(trajectory)[0].startswith("[p1] Lima")


def test_a_service_that_fails_every_request_is_still_infra_error(backend: Any, search_url: str):
    Faults.broken.set()  # the probe fails too: the service is down, not the model's query
    trajectory = play(backend, [call("search", query="Peru"), "Answer: Peru"])
    assert trajectory.status == "infra_error" and trajectory.final_reward is None
    assert "answered 500" in trajectory.error


def test_a_dead_search_service_is_still_infra_error():
    from agentgym.envs.search.backends import HTTPBackend

    with serve_in_thread(search_app()) as url:
        pass  # stopped: nothing listens there any more
    backend = HTTPBackend(url, timeout=0.5)
    try:
        for turn in (call("search", query="Peru\x00"), call("open", doc_id="p1/")):
            trajectory = play(backend, [turn, "Answer: Peru"])
            assert trajectory.status == "infra_error" and trajectory.final_reward is None
            assert "ConnectError" in trajectory.error
    finally:
        backend.close()


# --- the ToolAPI shop service ------------------------------------------------------------------


@pytest.fixture(scope="module")
def shop() -> Iterator[tuple[str, dict[str, str]]]:
    """The shop's URL and the headers of a tenant of its own."""
    require("fastapi")
    require("uvicorn")
    from agentgym.envs.toolapi import service

    server = service.acquire()
    try:
        admin = {service.ADMIN_HEADER: server.admin_token}
        tenant = httpx.post(server.base_url + "/admin/tenants", headers=admin).json()["tenant"]
        yield server.base_url, {service.TENANT_HEADER: tenant, "Content-Type": "application/json"}
    finally:
        service.release(server)


BAD_JSON_BODIES = [
    b'{"amount_cents": 1e309, "reason": "late"}',  # Python's json reads it as infinity
    b'{"amount_cents": -1e400, "reason": "late"}',
    b'{"amount_cents": NaN, "reason": "late"}',
    b'{"amount_cents": Infinity, "reason": "late"}',
    b'{"amount_cents": 1, "reason": "\\ud800"}',  # a lone surrogate
    b'"\\udfff"',
]


@pytest.mark.parametrize("body", BAD_JSON_BODIES, ids=lambda b: b.decode())
def test_the_shop_answers_json_it_cannot_echo_with_422_not_500(shop: Any, body: bytes) -> None:
    # FastAPI's 422 echoes the invalid input and could not serialise these: HTTP 500
    url, headers = shop
    response = httpx.post(url + "/orders/O1000/refunds", content=body, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][0] == "body"


def test_the_shop_refuses_a_lone_surrogate_in_an_address_with_422(shop: Any) -> None:
    url, headers = shop
    body = b'{"street": "1 \\ud800 St", "city": "X", "zip": "12345"}'
    response = httpx.put(url + "/customers/C101/address", content=body, headers=headers)
    assert response.status_code == 422 and "\\ud800" in response.text


def test_odd_shop_tool_calls_are_results_or_tool_errors() -> None:
    """Through the env: none of these is an infra_error (the client and service handle them)."""
    require("fastapi")
    require("uvicorn")
    raw = raw_call
    turns = [
        call("get_customer", customer_id=""),  # /customers/: a redirect, shown to the model
        call("get_customer", customer_id="%2e%2e"),
        call("get_customer", customer_id="../admin/tenants"),
        call("get_customer", customer_id="\x00"),
        call("get_customer", customer_id="C" * 70_000),  # too long for a URL: refused
        call("find_customer", email="\u212a@EXAMPLE.com"),  # Kelvin sign: lower()s to "k"
        call("list_orders", customer_id="C101", status="\x00"),
        raw("refund_order", '{"order_id": "O1000", "amount_cents": 1e309, "reason": "late"}'),
        raw("refund_order", '{"order_id": "O1000", "amount_cents": NaN, "reason": "late"}'),
        raw("refund_order", '{"order_id": "O1000", "amount_cents": 1e300, "reason": "late"}'),
        raw(
            "refund_order",
            '{"order_id": "O1000", "amount_cents": 9223372036854775808, "reason": "late"}',
        ),  # fmt: skip
        raw("refund_order", '{"order_id": "O1000", "amount_cents": 1, "reason": "\\ud800"}'),
        raw("refund_order", '{"order_id": {"$ne": 1}, "amount_cents": 1, "reason": "late"}'),
        raw(
            "update_customer_address",
            '{"customer_id": "C101", "street": "a", "city": "b", "zip": "12345\\n"}',
        ),  # fmt: skip
        raw("change_item_quantity", '{"order_id": "O1002", "product_id": "..", "quantity": 2}'),
        raw("get_product", '{"product_id": "P01", "env": 1}'),
    ]
    env = agentgym.make("agentgym/ToolAPI-v0", max_turns=len(turns) + 2)
    try:
        [trajectory] = agentgym.rollout(
            lambda: env, agentgym.ScriptedPolicy([*turns, "Done."]), tasks=[0]
        )
    finally:
        env.close()
    assert trajectory.status == "ok" and trajectory.final_reward == 0.0, trajectory.error
    assert len(tool_messages(trajectory)) == len(turns)

"""OpenAPI 3 -> tools: schema merging, $ref resolution, and calls over real loopback HTTP."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agentgym import ConfigError, InfraError, Tool, ToolArgumentsError, ToolEnv, ToolError
from agentgym._openapi import openapi_tools, operations
from tests.conftest import send_json, serve_in_thread

PET = {
    "type": "object",
    "title": "Pet",
    "properties": {
        "name": {"type": "string", "title": "Name"},
        "category": {"$ref": "#/components/schemas/Category"},
    },
    "required": ["name"],
}
DOC: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "pets", "version": "1"},
    "paths": {
        "/owners/{owner}/pets/{pet_id}": {
            "parameters": [{"$ref": "#/components/parameters/Owner"}],
            "put": {
                "operationId": "update_pet",
                "summary": "Update a pet.",
                "description": "Replaces the pet's name and category.",
                "parameters": [
                    {
                        "name": "pet_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 0, "exclusiveMinimum": True},
                    },
                    {"name": "dry_run", "in": "query", "schema": {"type": "boolean"}},
                    {
                        "name": "X-Api-Key",
                        "in": "header",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                ],
                "requestBody": {"$ref": "#/components/requestBodies/PetBody"},
                "responses": {"200": {"$ref": "#/components/responses/Tree"}},
            },
        },
        "/echo/{id}": {
            "post": {
                "operationId": "clash",
                "parameters": [
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
                    {"name": "env", "in": "query", "schema": {"type": "string"}},
                ],
                "requestBody": {
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"id": {"type": "integer"}},
                            }
                        }
                    },
                },
            },
            "get": {
                "operationId": "echo",
                "parameters": [
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
                    {
                        "name": "q",
                        "in": "query",
                        "description": "words",
                        "schema": {"type": "string"},
                    },
                ],
            },
            "patch": {
                "operationId": "tags",
                "parameters": [
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {"type": "array", "items": {"type": "string"}},
                        }
                    },
                },
            },
        },
        "/status/{code}": {
            "parameters": [
                {"name": "code", "in": "path", "required": True, "schema": {"type": "integer"}},
            ],
            "get": {"operationId": "status"},
            "post": {"operationId": "post_status"},
        },
        "/flaky": {"get": {"operationId": "flaky"}},
        "/busy": {"post": {"operationId": "busy"}},
        "/hang": {"get": {"operationId": "hang"}},
    },
    "components": {
        "parameters": {
            "Owner": {
                "name": "owner",
                "in": "path",
                "required": True,
                "description": "the owner's handle",
                "schema": {"type": "string"},
            },
        },
        "requestBodies": {
            "PetBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Pet"}}},
            },
        },
        "schemas": {
            "Pet": PET,
            "Category": {
                "type": "object",
                "nullable": True,
                "properties": {"label": {"type": "string"}},
            },
            "Node": {
                "type": "object",
                "properties": {"child": {"$ref": "#/components/schemas/Node"}},
            },
        },
        "responses": {  # a recursive response schema: never needed by a tool, never an error
            "Tree": {
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}
            },
        },
    },
}


def _tool(tools: list[Tool], name: str) -> Tool:
    return next(t for t in tools if t.name == name)


def test_path_query_and_body_merge_into_one_schema_with_refs_resolved() -> None:
    tool = _tool(openapi_tools(DOC, "http://127.0.0.1:1"), "update_pet")
    assert tool.description == "Update a pet.\n\nReplaces the pet's name and category."
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "owner": {"type": "string", "description": "the owner's handle"},
            "pet_id": {"type": "integer", "exclusiveMinimum": 0},  # the 3.0 boolean form
            "dry_run": {"type": "boolean"},
            "name": {"type": "string"},
            "category": {"type": ["object", "null"], "properties": {"label": {"type": "string"}}},
        },
        "required": ["owner", "pet_id", "name"],  # the header is the client's, not the model's
        "additionalProperties": False,
    }
    tool.validate({"owner": "al", "pet_id": 1, "name": "Rex", "category": None})
    with pytest.raises(ToolArgumentsError, match="pet_id"):
        tool.validate({"owner": "al", "pet_id": 0, "name": "Rex"})


def test_clashing_names_are_prefixed_with_their_place_and_other_bodies_stay_whole() -> None:
    tools = openapi_tools(DOC, "http://127.0.0.1:1")
    assert list(_tool(tools, "clash").parameters["properties"]) == [
        "path_id",
        "query_env",
        "body_id",
    ]
    tags = _tool(tools, "tags").parameters
    assert tags["properties"]["body"] == {"type": "array", "items": {"type": "string"}}
    assert tags["required"] == ["id", "body"]


def _with_schema(schema: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(DOC))
    doc["paths"]["/echo/{id}"]["post"]["requestBody"]["content"]["application/json"]["schema"] = (
        schema
    )
    return doc


def test_a_cyclic_or_missing_ref_is_a_clear_config_error() -> None:
    doc = _with_schema({"$ref": "#/components/schemas/A"})
    doc["components"]["schemas"]["A"] = {"properties": {"b": {"$ref": "#/components/schemas/B"}}}
    doc["components"]["schemas"]["B"] = {"items": {"$ref": "#/components/schemas/A"}}
    with pytest.raises(
        ConfigError,
        match=r"cyclic \$ref #/components/schemas/A -> "
        r"#/components/schemas/B -> #/components/schemas/A",
    ):
        operations(doc)
    with pytest.raises(ConfigError, match="'Gone' in the document"):
        operations(_with_schema({"$ref": "#/components/schemas/Gone"}))
    with pytest.raises(ConfigError, match="not local"):
        operations(_with_schema({"$ref": "other.yaml#/Pet"}))


def test_documents_the_tools_cannot_use_are_refused() -> None:
    with pytest.raises(ConfigError, match="OpenAPI 3"):
        operations({"swagger": "2.0", "paths": {}})
    no_id = {"openapi": "3.1.0", "paths": {"/x": {"get": {"summary": "x"}}}}
    with pytest.raises(ConfigError, match="GET /x has no operationId"):
        operations(no_id)


# --- calls over real HTTP --------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    """Echoes requests; ``/status/N`` answers N; ``/hang`` answers when the test lets it;
    ``/flaky`` fails its first request; nothing is served under ``/nowhere`` (a base URL with
    a wrong path prefix). ``seen`` records each request's method and path."""

    release: threading.Event
    hang_arrived: threading.Event
    seen: list[tuple[str, str]]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.seen.append((self.command, self.path))
        if self.path == "/flaky":
            failed_before = self.seen.count(("GET", "/flaky")) > 1
            code, payload = (200, {"ok": True}) if failed_before else (500, {"detail": "blip"})
        elif self.path == "/busy":  # two 429s, then served
            served = self.seen.count(("POST", "/busy")) > 2
            code, payload = (200, {"ok": True}) if served else (429, {"detail": "slow down"})
        elif self.path.startswith("/status/"):
            code, payload = int(self.path.split("/")[2]), {"detail": "not today"}
        elif self.path.startswith("/nowhere"):
            code, payload = 404, {"detail": "Not Found"}
        elif self.path == "/hang":
            self.hang_arrived.set()
            self.release.wait(10)
            code, payload = 200, {}
        else:
            code, payload = 200, {"method": self.command, "path": self.path, "body": body}
        send_json(self, code, payload)

    do_GET = do_POST = do_PUT = do_PATCH = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # a client that timed out has left (the /hang tests): no server bug to print
        super().handle_error(request, client_address)


@pytest.fixture
def seen() -> list[tuple[str, str]]:
    """The requests the ``server`` fixture answered, as (method, path)."""
    return []


@pytest.fixture
def hang_arrived() -> threading.Event:
    """Set once the ``server`` fixture's handler holds a ``/hang`` request: a client that
    timed out may return before the server's thread has even recorded it (a loaded machine)."""
    return threading.Event()


@pytest.fixture
def server(seen: list[tuple[str, str]], hang_arrived: threading.Event) -> Iterator[str]:
    release = threading.Event()
    attributes = {"release": release, "seen": seen, "hang_arrived": hang_arrived}
    handler = type("Handler", (_Handler,), attributes)
    httpd = _Server(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = serve_in_thread(httpd)
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


async def test_a_call_sends_path_query_and_body_and_returns_status_and_json(server: str) -> None:
    tools = openapi_tools(DOC, server + "/")
    result = await _tool(tools, "update_pet").acall(
        {"owner": "a/b c", "pet_id": 7, "dry_run": True, "name": "Rex", "category": {"label": "x"}}
    )
    assert result == {
        "status": 200,
        "body": {
            "method": "PUT",
            "path": "/owners/a%2Fb%20c/pets/7?dry_run=true",
            "body": {"name": "Rex", "category": {"label": "x"}},
        },
    }
    clash = await _tool(tools, "clash").acall({"path_id": "p", "query_env": "e", "body_id": 3})
    assert clash["body"]["path"] == "/echo/p?env=e" and clash["body"]["body"] == {"id": 3}
    tags = await _tool(tools, "tags").acall({"id": "p", "body": ["a", "b"]})
    assert tags["body"]["body"] == ["a", "b"]


async def test_4xx_is_the_models_error_and_5xx_the_services(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agentgym._service_faults.BUSY_WAITS", ())
    status = _tool(openapi_tools(DOC, server), "status")
    with pytest.raises(ToolError, match="HTTP 409 from status: not today"):
        await status.acall({"code": 409})
    with pytest.raises(InfraError, match="HTTP 503"):
        await status.acall({"code": 503})
    with pytest.raises(ToolError, match="cannot be '..'"):
        await _tool(openapi_tools(DOC, server), "echo").acall({"id": ".."})


async def test_a_hung_or_unreachable_service_is_an_infra_error(server: str) -> None:
    hang = _tool(openapi_tools(DOC, server, timeout=1.0), "hang")
    with pytest.raises(InfraError, match="no response .* within 1 s"):
        await hang.acall({})
    with socket.socket() as sock:  # a port nobody listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused = _tool(openapi_tools(DOC, f"http://127.0.0.1:{port}"), "hang")
    with pytest.raises(InfraError, match="ConnectError"):
        await refused.acall({})


async def test_429_and_503_are_tried_again_then_the_services_whoever_asked(
    server: str, seen: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agentgym._service_faults.BUSY_WAITS", (0.01, 0.02, 0.04))
    tools = openapi_tools(DOC, server, probe="/health")
    assert await _tool(tools, "busy").acall({}) == {"status": 200, "body": {"ok": True}}
    assert seen == [("POST", "/busy")] * 3  # a 429 was not served: a POST is sent again
    for code in (429, 503):  # overloaded or down: the probe may reach a replica that is not
        seen.clear()
        with pytest.raises(InfraError, match=f"busy or down \\(HTTP {code}\\)") as raised:
            await _tool(tools, "status").acall({"code": code})
        assert not isinstance(raised.value, ToolError)
        assert seen == [("GET", f"/status/{code}")] * 4  # tried, then again after each wait
    seen.clear()
    with pytest.raises(InfraError, match="HTTP 503"):
        await _tool(tools, "post_status").acall({"code": 503})
    assert seen == [("POST", "/status/503")]  # a 503 may have been served: not sent again


async def test_with_a_probe_a_call_that_breaks_a_working_service_is_the_models(
    server: str, seen: list[tuple[str, str]], hang_arrived: threading.Event
) -> None:
    """A model that can make the service fail (a 500, a hang) must not turn its episode into
    an unscored ``infra_error``: while the service answers the probe, it is a tool error."""
    # 1 s: every request (the probe's too) has it, and only /hang waits it out
    tools = openapi_tools(DOC, server, timeout=1.0, probe="/health")
    with pytest.raises(ToolError, match="status failed: the service failed with HTTP 500.*"
                       "answers other requests, so change the arguments"):  # fmt: skip
        await _tool(tools, "status").acall({"code": 500})
    assert seen == [("GET", "/status/500")] * 2 + [("GET", "/health")]  # sent again, then probed
    seen.clear()
    with pytest.raises(ToolError, match="no response .* within 1 s"):
        await _tool(tools, "hang").acall({})
    assert hang_arrived.wait(10)  # the server's thread may record it after the probe's
    assert sorted(seen) == [("GET", "/hang"), ("GET", "/health")]  # a timeout is not sent again
    seen.clear()
    with pytest.raises(ToolError, match="HTTP 502"):
        await _tool(tools, "post_status").acall({"code": 502})
    assert seen == [("POST", "/status/502"), ("GET", "/health")]  # a POST is not sent again
    seen.clear()
    assert await _tool(tools, "flaky").acall({}) == {"status": 200, "body": {"ok": True}}
    assert seen == [("GET", "/flaky")] * 2  # a failure that passes is nobody's


async def test_with_a_probe_a_service_that_fails_it_too_is_infrastructure(server: str) -> None:
    down = _tool(openapi_tools(DOC, server, probe="/status/500"), "status")
    fails_too = "HTTP 500: .*; the probe .*/status/500 fails too"
    with pytest.raises(InfraError, match=fails_too) as raised:
        await down.acall({"code": 500})
    assert not isinstance(raised.value, ToolError)
    with socket.socket() as sock:  # a port nobody listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gone = _tool(openapi_tools(DOC, f"http://127.0.0.1:{port}", probe="/health"), "status")
    with pytest.raises(InfraError, match="ConnectError"):
        await gone.acall({"code": 200})
    with pytest.raises(ConfigError, match="probe must be a path starting with '/'"):
        openapi_tools(DOC, server, probe="health")


async def test_with_a_probe_a_base_url_missing_its_path_prefix_is_infrastructure(
    server: str, seen: list[tuple[str, str]]
) -> None:
    """Every call to a base URL without the service's prefix is a 404: were it the model's
    error, a whole run would score 0 with nothing said. A tool's first 404 asks the probe once."""
    wrong = _tool(openapi_tools(DOC, server + "/nowhere", probe="/health"), "status")
    prefix = "HTTP 404 for .*/nowhere/status/200, and the probe .*/nowhere/health fails too"
    with pytest.raises(InfraError, match=prefix + ".*missing the path prefix") as raised:
        await wrong.acall({"code": 200})
    assert not isinstance(raised.value, ToolError)
    seen.clear()
    right = _tool(openapi_tools(DOC, server, probe="/health"), "status")
    for _ in range(2):  # a 404 under a root the probe answers is the arguments'
        with pytest.raises(ToolError, match="HTTP 404 from status"):
            await right.acall({"code": 404})
    assert seen == [("GET", "/status/404"), ("GET", "/health"), ("GET", "/status/404")]


def test_in_an_env_a_4xx_goes_back_to_the_model_and_a_5xx_ends_the_episode(server: str) -> None:
    env = ToolEnv(openapi_tools(DOC, server), tasks=[{"prompt": "go"}])
    env.reset(seed=0)
    call = {"name": "status", "arguments": {"code": 404}}
    obs, _, terminated, _, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert not terminated and obs[-1]["content"] == "Error: HTTP 404 from status: not today"
    assert info["tool_errors"] == ["HTTP 404 from status: not today"]
    call["arguments"] = {"code": 500}
    with pytest.raises(InfraError, match="HTTP 500"):
        env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    env.close()

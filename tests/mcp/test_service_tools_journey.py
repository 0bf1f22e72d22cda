"""A user's first envs over services: the mistakes they make fail at once, naming the fix,
and an outcome is classified as the docs say (docs/envs/mcp.md, docs/envs/toolapi.md).

Real servers only: a FastAPI service on loopback, and a small MCP server speaking raw
JSON-RPC over stdio (no SDK import, so it starts in milliseconds).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgym import ToolEnv, openapi_tools
from agentgym._errors import ConfigError, InfraError
from tests.conftest import require

#: An MCP server in plain JSON-RPC: logs "start PID" when it starts and "ready PID" when it
#: answers `initialize`, which it holds until $NEED servers have started (or 1 s passed).
RAW_SERVER = textwrap.dedent("""
    import json, os, sys, time
    LOG, NEED = os.environ["LOG"], int(os.environ.get("NEED", "0"))

    def append(line):
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, (line + "\\n").encode())
        os.close(fd)

    def started():
        with open(LOG) as f:
            return sum(line.startswith("start") for line in f)

    append(f"start {os.getpid()}")
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        method = msg["method"]
        if method == "initialize":
            deadline = time.monotonic() + 1.0
            while started() < NEED and time.monotonic() < deadline:
                time.sleep(0.01)
            append(f"ready {os.getpid()}")
            result = {"protocolVersion": msg["params"]["protocolVersion"],
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "0"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "where", "description": "The server's folder.",
                                 "inputSchema": {"type": "object", "properties": {}}}]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": os.getcwd()}], "isError": False}
        elif method == "ping":
            result = {}
        else:
            error = {"code": -32601, "message": method}
            print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": error}), flush=True)
            continue
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
""")


@pytest.fixture
def raw_server(tmp_path: Path) -> Path:
    path = tmp_path / "raw_server.py"
    path.write_text(RAW_SERVER)
    return path


# --- OpenAPI tools ------------------------------------------------------------------------------


def shop_app() -> Any:
    fastapi = require("fastapi")
    app = fastapi.FastAPI()

    @app.get("/health", operation_id="health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/divide", operation_id="divide", summary="Divide 1 by x")
    def divide(x: int) -> dict[str, int]:
        return {"r": 1 // x}  # x=0: HTTP 500, an input the service cannot handle

    return app


@pytest.fixture(scope="module")
def shop() -> Iterator[tuple[str, dict[str, Any]]]:
    require("uvicorn")
    import httpx

    from agentgym.serve._thread import serve_in_thread

    with serve_in_thread(shop_app()) as url:
        yield url, httpx.get(url + "/openapi.json").json()


def divide_by_zero(tools: list[Any]) -> Any:
    """One episode: the model calls divide(x=0); returns step's result or its exception."""
    env = ToolEnv(tools, tasks=[{"prompt": "x"}])
    env.reset(seed=0)
    try:
        return env.step('<tool_call>{"name": "divide", "arguments": {"x": 0}}</tool_call>')
    except InfraError as exc:
        return exc
    finally:
        env.close()


@pytest.mark.parametrize(
    ("given", "fix"),
    [
        ("openapi.json", "read_text()"),
        (Path("openapi.json"), "read_text()"),
        ("http://127.0.0.1:8000/openapi.json", "httpx.get('http://127.0.0.1:8000/openapi.json')"),
        ('{"openapi": "3.1.0", "paths": {}}', "json.loads"),
    ],
)
def test_a_document_not_given_as_a_dict_is_a_config_error_naming_the_fix(given: Any, fix: str):
    with pytest.raises(ConfigError, match="parsed dict") as caught:
        openapi_tools(given, "http://127.0.0.1:8000")
    assert fix in str(caught.value)


def test_a_response_given_as_the_document_says_to_parse_it(shop: tuple[str, dict[str, Any]]):
    import httpx

    url, _ = shop
    with pytest.raises(ConfigError, match=r"response\.json\(\)"):
        openapi_tools(httpx.get(url + "/openapi.json"), url)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"base_url": "127.0.0.1:8000"}, "base_url"),
        ({"base_url": "http://127.0.0.1:8000", "timeout": 0}, "timeout"),
        ({"base_url": "http://127.0.0.1:8000", "timeout": -1.0}, "timeout"),
    ],
)
def test_settings_that_would_fail_every_call_are_refused_up_front(
    shop: tuple[str, dict[str, Any]], kwargs: dict[str, Any], named: str
):
    # before: accepted, then every call failed as infra_error (httpx refuses a URL without a
    # scheme; a timeout of 0 times out at once), so a whole eval was silently dropped
    _, doc = shop
    with pytest.raises(ConfigError, match=named):
        openapi_tools(doc, **kwargs)


def test_a_probe_path_the_service_404s_is_named_as_the_fix(shop: tuple[str, dict[str, Any]]):
    url, doc = shop
    failure = divide_by_zero(openapi_tools(doc, url, probe="/healthz"))
    assert isinstance(failure, InfraError)
    assert "HTTP 404" in str(failure) and "probe=" in str(failure)


def test_the_outcome_classes_of_a_call_the_service_fails(shop: tuple[str, dict[str, Any]]):
    url, doc = shop
    _, _, _, _, info = divide_by_zero(openapi_tools(doc, url, probe="/health"))
    assert "HTTP 500" in info["tool_errors"][0]  # the service works: the model's input broke it
    assert isinstance(divide_by_zero(openapi_tools(doc, url)), InfraError)  # no probe
    down = divide_by_zero(openapi_tools(doc, "http://127.0.0.1:9", probe="/health"))
    assert isinstance(down, InfraError) and "probe" in str(down)  # nothing listens on port 9


# --- MCP servers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["args", "tools"])
def test_a_list_field_given_as_one_string_is_a_config_error(field: str):
    from agentgym.mcp import MCPServer

    # before: split into characters, args=('s', 'e', 'r', ...), and the server failed to start
    with pytest.raises(ConfigError, match=f"{field} must be a list of strings"):
        MCPServer(command=sys.executable, **{field: "server.py"})


@pytest.mark.parametrize("prefix", ["time.", "a b_", "x" * 49])
def test_a_prefix_no_tool_name_may_hold_is_refused_when_the_server_is_made(prefix: str):
    from agentgym.mcp import MCPServer

    # before: accepted, and every tool got a name the model's API refuses (only check said so)
    with pytest.raises(ConfigError, match="prefix .* may hold only letters, digits"):
        MCPServer(command=sys.executable, prefix=prefix)
    assert MCPServer(command=sys.executable, prefix="time_").prefix == "time_"


def test_an_env_never_closed_leaves_no_workspace_copy_at_exit(raw_server: Path, tmp_path: Path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "data.txt").write_text("x")
    script = textwrap.dedent(f"""
        import faulthandler, sys
        faulthandler.dump_traceback_later(50, exit=True)  # a hang says where, before the 60 s
        from agentgym.mcp import MCPServer, MCPToolEnv
        env = MCPToolEnv(
            [MCPServer(command=sys.executable, args=[{str(raw_server)!r}],
                       env={{"LOG": {str(tmp_path / "log")!r}}}, workspace={str(workspace)!r})],
            tasks=[{{"prompt": "x"}}],
        )
        env.reset(seed=0)
        _, _, _, _, info = env.step('<tool_call>{{"name": "where", "arguments": {{}}}}</tool_call>')
        print(env.messages[-1]["content"])
        # no env.close(): the script ends mid-episode, as an interrupted run does
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    copy = done.stdout.strip().splitlines()[-1]
    assert "agentgym-mcp-" in copy  # the server ran in a copy of the workspace
    assert not os.path.exists(copy), "the episode's workspace copy outlived the process"
    assert "Traceback" not in done.stderr, done.stderr


def test_stdio_servers_start_a_few_at_a_time(
    raw_server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from agentgym.mcp import MCPServer
    from agentgym.mcp import _connection as connection

    # a fresh limit of 2 for this test (the semaphore is made on first use, on the hub loop)
    monkeypatch.setattr(connection, "MAX_STARTING", 2, raising=False)
    monkeypatch.setattr(connection, "_starting", [], raising=False)
    log, count = tmp_path / "log", 5
    log.touch()
    # each server holds its handshake until all `count` have started: started all at once
    # (before), they all overlap; a few at a time, each waits out its 1 s and goes on
    spec = MCPServer(
        command=sys.executable, args=[str(raw_server)], env={"LOG": str(log), "NEED": str(count)}
    )

    async def start_all() -> list[Any]:
        opening = (connection.MCPConnection.open(spec) for _ in range(count))
        return list(await asyncio.gather(*opening))

    opened = connection.on_hub_sync(start_all())
    try:
        starting = most = 0
        for line in log.read_text().splitlines():
            starting += 1 if line.startswith("start") else -1
            most = max(most, starting)
        assert most <= 2, f"{most} servers were starting at once"
        assert sum(line.startswith("ready") for line in log.read_text().splitlines()) == count
    finally:
        connection.on_hub_sync(connection.close_all(opened))
    assert all(c.broken for c in opened)


def test_two_servers_listing_the_same_tool_name_is_a_config_error_naming_prefix(
    raw_server: Path, tmp_path: Path
):
    from agentgym.mcp import MCPServer, MCPToolEnv

    def spec(**kwargs: Any) -> Any:
        return MCPServer(
            command=sys.executable, args=[str(raw_server)], env={"LOG": str(tmp_path / "log")},
            **kwargs,
        )  # fmt: skip

    with pytest.raises(ConfigError, match="prefix="):
        MCPToolEnv([spec(), spec(cwd=str(tmp_path))], tasks=[{"prompt": "x"}])
    env = MCPToolEnv([spec(), spec(cwd=str(tmp_path), prefix="b_")], tasks=[{"prompt": "x"}])
    assert sorted(env.tools) == ["b_where", "where"]
    env.close()
    env.close()  # twice: nothing to do the second time


def test_json_of_the_raw_server_is_what_the_sdk_reads(raw_server: Path, tmp_path: Path):
    """The helper server above is a real MCP server: a call's result reaches the model."""
    from agentgym.mcp import MCPServer, MCPToolEnv

    env = MCPToolEnv(
        [MCPServer(command=sys.executable, args=[str(raw_server)],
                   env={"LOG": str(tmp_path / "log")}, cwd=str(tmp_path))],
        tasks=[{"prompt": "x"}],
    )  # fmt: skip
    env.reset(seed=0)
    new, _, _, _, info = env.step(
        "<tool_call>" + json.dumps({"name": "where", "arguments": {}}) + "</tool_call>"
    )
    env.close()
    assert new[-1]["content"] == str(tmp_path) and not info["tool_errors"]

"""Per-call overhead of a tool: a direct Python call vs agentgym, MCP and OpenAPI on loopback.

One function, ``add(a, b)``, called the ways an env can reach it:

- direct: the Python function itself;
- ``Tool.acall``: the agentgym `tool` (schema check, then the call on a worker thread; and
  the same function written ``async def``, which runs on the event loop);
- ``ToolEnv.astep``: one assistant turn with that call (dispatch, tool message, bookkeeping),
  for both; the MCP and OpenAPI tools below are async too, so compare them with that row;
- MCP: the same function on an MCP server of ours (the SDK's ``MCPServer``) in a subprocess,
  through `agentgym.mcp.MCPToolEnv`, over stdio and over streamable HTTP;
- OpenAPI: the same function as a FastAPI route (uvicorn in a subprocess), through
  `agentgym.openapi_tools` in a `ToolEnv`, one keep-alive httpx client.

Each call is timed on its own; prints median and p99 microseconds per call and the ratio of
medians to the direct call. Servers run in their own processes, as real services do, so the
figures include loopback transport and the server's own handling (not pinned to one core).

    python bench/tool_overhead_bench.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from agentgym.engine._serve import free_port

HOST = "127.0.0.1"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


async def add_async(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


# ---- the servers (run as subprocesses of this script) -----------------------------------------


def serve_mcp(port: int | None) -> None:
    """``add`` on an MCP server: stdio when ``port`` is None, else streamable HTTP."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench", log_level="WARNING")
    server.tool()(add)
    if port is None:
        server.run()
    else:
        server.run("streamable-http", host=HOST, port=port)


def serve_openapi(port: int) -> None:
    """``add`` as ``GET /add?a=..&b=..`` (operationId ``add``) on FastAPI + uvicorn."""
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI(title="bench")

    @app.get("/add", operation_id="add", summary="Add two integers.")
    def add_route(a: int, b: int) -> dict[str, int]:
        return {"sum": add(a, b)}

    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False)


@contextlib.contextmanager
def subprocess_server(*args: str, port: int) -> Iterator[None]:
    """This script serving ``args`` in a subprocess, until ``port`` accepts connections."""
    proc = subprocess.Popen([sys.executable, __file__, *args])
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection((HOST, port), timeout=1).close()
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server {args} did not start (exit code {proc.poll()})")
            time.sleep(0.05)  # polling a port that is not open yet; not synchronisation
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ---- timing -----------------------------------------------------------------------------------


def time_direct(calls: int) -> list[float]:
    """Seconds of each of ``calls`` direct calls (the timer's own cost included)."""
    clock, samples = time.perf_counter, []
    for i in range(calls):
        start = clock()
        add(i, 1)
        samples.append(clock() - start)
    return samples


async def time_calls(
    call: Callable[[], Awaitable[Any]],
    calls: int,
    prepare: Callable[[int], Awaitable[Any]] | None = None,
) -> list[float]:
    """Seconds of each of ``calls`` awaited calls, after 100 untimed ones to warm up.

    ``prepare(i)`` runs untimed before call ``i`` (a new episode now and then).
    """
    clock, samples = time.perf_counter, []
    for i in range(100 + calls):
        if prepare is not None:
            await prepare(i)
        start = clock()
        await call()
        elapsed = clock() - start
        if i >= 100:
            samples.append(elapsed)
    return samples


TURN = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": "c1", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
}


async def time_env_turns(env: Any, calls: int) -> list[float]:
    """Seconds of each `ToolEnv.astep` calling ``add``; a new episode every 50 turns."""

    async def new_episode(i: int) -> None:
        if i % 50 == 0:
            await env.areset(seed=i)

    async def turn() -> None:
        messages, *_ = await env.astep(TURN)
        if messages[-1]["content"].startswith("Error"):
            raise RuntimeError(f"the call failed: {messages[-1]['content']}")

    try:
        return await time_calls(turn, calls, new_episode)
    finally:
        await env.aclose()


async def measure_all(calls: int) -> dict[str, list[float]]:
    import httpx

    import agentgym
    from agentgym.mcp import MCPServer, MCPToolEnv, close_shared_servers

    results: dict[str, list[float]] = {"direct Python call": time_direct(50 * calls)}
    sync_tool, async_tool = agentgym.tool(add), agentgym.tool(name="add")(add_async)
    arguments = {"a": 2, "b": 3}
    results["Tool.acall (def)"] = await time_calls(lambda: sync_tool.acall(arguments), calls)
    results["Tool.acall (async def)"] = await time_calls(lambda: async_tool.acall(arguments), calls)
    options: dict[str, Any] = {"tasks": [{"prompt": "add"}], "max_turns": 1000}
    results["ToolEnv.astep (def)"] = await time_env_turns(
        agentgym.ToolEnv([sync_tool], **options), calls
    )
    results["ToolEnv.astep (async def)"] = await time_env_turns(
        agentgym.ToolEnv([async_tool], **options), calls
    )
    stdio = MCPServer(command=sys.executable, args=[__file__, "--serve", "mcp"], scope="shared")
    results["MCP stdio (MCPToolEnv)"] = await time_env_turns(MCPToolEnv([stdio], **options), calls)
    port = free_port()
    with subprocess_server("--serve", "mcp", "--port", str(port), port=port):
        http = MCPServer(url=f"http://{HOST}:{port}/mcp", scope="shared")
        results["MCP streamable HTTP (MCPToolEnv)"] = await time_env_turns(
            MCPToolEnv([http], **options), calls
        )
    close_shared_servers()
    port = free_port()
    with subprocess_server("--serve", "openapi", "--port", str(port), port=port):
        base = f"http://{HOST}:{port}"
        async with httpx.AsyncClient() as client:
            doc = (await client.get(f"{base}/openapi.json")).json()
            tools = agentgym.openapi_tools(doc, base, client=lambda env: client)
            results["OpenAPI over HTTP (ToolEnv)"] = await time_env_turns(
                agentgym.ToolEnv(tools, **options), calls
            )
    return results


def report(results: dict[str, list[float]], calls: int) -> None:
    base = statistics.median(results["direct Python call"])
    print(f"tool call overhead, add(a, b), {calls} timed calls each (direct: {50 * calls})")
    print(f"  {'':34s} {'median us':>10s} {'p99 us':>10s} {'x direct':>10s}")
    for name, samples in results.items():
        median = statistics.median(samples)
        p99 = statistics.quantiles(samples, n=100)[98]
        print(f"  {name:34s} {median * 1e6:10.2f} {p99 * 1e6:10.2f} {median / base:10,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--serve", choices=["mcp", "openapi"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "mcp":
        serve_mcp(args.port)
    elif args.serve == "openapi":
        serve_openapi(args.port)
    else:
        report(asyncio.run(measure_all(args.calls)), args.calls)


if __name__ == "__main__":
    main()

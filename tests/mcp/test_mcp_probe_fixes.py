"""What a prober found in the MCP layer: an exit that hung after a cancelled start, listings
that never end, and errors that named the wrong cause or none.

Most servers here speak raw JSON-RPC (no SDK import): they list exactly what a test gives them,
which a server built on the SDK would refuse to list.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentgym import ConfigError
from agentgym.engine._serve import free_port
from agentgym.mcp import MCPServer, MCPServerError, MCPToolEnv, _connection
from agentgym.mcp._connection import list_server_tools, on_hub
from tests.mcp.conftest import MISBEHAVING_SERVER, ROOT, pid_alive
from tests.mcp.test_cancel_mcp import HANGING_START

TASK = [{"prompt": "use the tools"}]
OBJECT = {"type": "object", "properties": {"x": {"type": "string"}}}

#: Lists the tools in $TOOLS (JSON). $PAGES: "repeat" pages on with the same cursor, "endless"
#: with a new one each time; $PAGE_SECONDS: how long each page takes; $LIST=exit: the server
#: dies when asked for its tools.
LISTING_SERVER = textwrap.dedent("""
    import json, os, sys, time
    TOOLS = json.loads(os.environ.get("TOOLS", "[]"))
    PAGES, LIST = os.environ.get("PAGES", ""), os.environ.get("LIST", "")
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        method, params = msg["method"], msg.get("params") or {}
        if method == "initialize":
            result = {"protocolVersion": params["protocolVersion"],
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "raw", "version": "0"}}
        elif method == "tools/list":
            if LIST == "exit":
                os._exit(3)
            time.sleep(float(os.environ.get("PAGE_SECONDS", "0")))
            result = {"tools": TOOLS}
            if PAGES == "repeat":
                result["nextCursor"] = "again"
            elif PAGES == "endless":
                result["nextCursor"] = str(int(params.get("cursor") or 0) + 1)
        else:
            result = {}
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
""")


@pytest.fixture
def listing(tmp_path: Path) -> Callable[..., MCPServer]:
    """A factory of specs for `LISTING_SERVER`: ``listing(tools, **env)``."""
    script = tmp_path / "listing_server.py"
    script.write_text(LISTING_SERVER)

    def spec(tools: list[dict[str, Any]], *, call_timeout: float = 20, **env: str) -> MCPServer:
        return MCPServer(command=sys.executable, args=[str(script)], call_timeout=call_timeout,
                         env={"TOOLS": json.dumps(tools), **env})  # fmt: skip

    return spec


# ---- 1. an exit while a cancelled start is still being closed ---------------------------------

#: Builds an env over a server with a workspace, cancels an episode while its server hangs at
#: start, and exits at once: the exit hook closes that session while its first close runs.
CANCEL_THEN_EXIT = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from agentgym import EpisodeSpec, ScriptedPolicy, run_episode
    from agentgym.mcp import MCPServer, MCPToolEnv

    script, pid_file, hang, workspace = sys.argv[1:]
    spec = MCPServer(command=sys.executable, args=[script], workspace=workspace,
                     start_timeout=120, env={"PID_FILE": pid_file, "HANG_FILE": hang,
                                             "STARTED_FILE": pid_file + ".started"})
    env = MCPToolEnv([spec], tasks=[{"prompt": "x"}])  # lists with a server that answers
    Path(hang).touch()
    pids = lambda: Path(pid_file).read_text().split()

    async def main():
        started = len(pids())
        episode = asyncio.create_task(
            run_episode(lambda: env, ScriptedPolicy(["x"]), EpisodeSpec(0, 0, 0, seed=0)))
        while len(pids()) == started:  # until the episode's server runs, its handshake pending
            await asyncio.sleep(0.02)
        episode.cancel()
        try:
            await episode
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
""")


def test_exiting_while_a_cancelled_start_is_closed_stops_the_server_and_returns(
    tmp_path: Path,
) -> None:
    """Before: the exit hook's second close cancelled the starting owner task again, which
    broke into the SDK's shielded shutdown: the process hung at exit, the server orphaned and
    its workspace copy left."""
    server, child = tmp_path / "server.py", tmp_path / "child.py"
    server.write_text(HANGING_START + MISBEHAVING_SERVER)
    child.write_text(CANCEL_THEN_EXIT)
    workspace, temp = tmp_path / "workspace", tmp_path / "temp"
    workspace.mkdir()
    (workspace / "state.txt").write_text("x")
    temp.mkdir()  # the child's temporary folder: where the workspace copies go
    pid_file = tmp_path / "pids"
    args = [str(server), str(pid_file), str(tmp_path / "hang"), str(workspace)]
    try:
        done = subprocess.run(
            [sys.executable, str(child), *args], cwd=ROOT, capture_output=True, text=True,
            env={**os.environ, "TMPDIR": str(temp)}, timeout=90,
        )  # fmt: skip
    finally:
        pids = [int(p) for p in pid_file.read_text().split()]
        left = [p for p in pids if pid_alive(p)]
        for pid in left:  # a hung child's servers are orphaned: stop them here
            os.kill(pid, 9)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(pids) == 2 and not left  # the listing's server and the episode's: both gone
    assert not list(temp.glob("agentgym-mcp-*")), "a workspace copy was left behind"


# ---- 2. listings that never end ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("pages", "error"),
    [
        ("repeat", "repeats the cursor 'again' when listing its tools"),
        ("endless", "lists its tools in more than {} pages"),  # MAX_TOOL_PAGES
    ],
)
async def test_a_listing_that_never_ends_is_refused(
    listing: Callable[..., MCPServer], pages: str, error: str
) -> None:
    """Before: building the env hung for ever, its memory growing page by page."""
    spec = listing([{"name": "a", "inputSchema": OBJECT}], PAGES=pages)
    error = error.format(_connection.MAX_TOOL_PAGES)
    with pytest.raises(ConfigError, match=re.escape(error)) as caught:
        await asyncio.wait_for(on_hub(list_server_tools(spec)), 30)
    assert spec.label in str(caught.value) and "fix the server" in str(caught.value)


async def test_a_listing_is_bounded_by_the_call_timeout(listing: Callable[..., MCPServer]) -> None:
    """Each page answered within ``call_timeout``, but the listing as a whole never did."""
    spec = listing([{"name": "a", "inputSchema": OBJECT}], call_timeout=1, PAGES="endless",
                   PAGE_SECONDS="0.3")  # fmt: skip
    with pytest.raises(MCPServerError, match="did not answer the listing of its tools within 1 s"):
        await asyncio.wait_for(on_hub(list_server_tools(spec)), 30)


# ---- 3, 4, 5. listings only the server can mend -----------------------------------------------


def test_a_tool_one_server_lists_twice_is_that_servers_to_fix(
    listing: Callable[..., MCPServer],
) -> None:
    """Before: "two MCP servers list a tool named 'a'; give one of them a prefix"."""
    spec = listing([{"name": "a", "inputSchema": OBJECT}, {"name": "a", "inputSchema": OBJECT}])
    with pytest.raises(ConfigError) as caught:
        MCPToolEnv([spec], tasks=TASK)
    message = str(caught.value)
    assert f"MCP server {spec.label!r} lists a tool named 'a' 2 times; fix the server" in message
    assert "a prefix does not help" in message and "\n" not in message
    one, other = (listing([{"name": "a", "inputSchema": OBJECT}], WHICH=w) for w in "12")
    with pytest.raises(ConfigError, match="two MCP servers list a tool named 'a'"):
        MCPToolEnv([one, other], tasks=TASK)


@pytest.mark.parametrize(
    ("tool", "complaint"),
    [
        ({"name": "a", "description": "no schema"}, "tools.0.inputSchema: Field required"),
        ({"name": "a", "inputSchema": {"type": "string"}}, "inputSchema.type: Input should"),
    ],
)
def test_a_listing_the_sdk_rejects_is_the_servers_to_fix_not_no_answer(
    listing: Callable[..., MCPServer], tool: dict[str, Any], complaint: str
) -> None:
    """Before: `NoAnswer`, "the server died or hung", for a server that answered, badly."""
    spec = listing([tool])
    with pytest.raises(ConfigError) as caught:
        MCPToolEnv([spec], tasks=TASK)
    message = str(caught.value)
    assert message.startswith(f"MCP server {spec.label!r} lists tools the MCP SDK rejects (")
    assert complaint in message and "fix the server" in message and "\n" not in message


def test_a_server_that_dies_while_listing_is_still_infrastructure(
    listing: Callable[..., MCPServer],
) -> None:
    spec = listing([{"name": "a", "inputSchema": OBJECT}], LIST="exit")
    with pytest.raises(MCPServerError, match="failed during the listing of its tools"):
        MCPToolEnv([spec], tasks=TASK)


@pytest.mark.parametrize("name", ["get.time", "my tool", "x" * 100, "ok_</tool_call>", ""])
def test_a_tool_name_models_refuse_is_refused_when_the_env_is_built(
    listing: Callable[..., MCPServer], name: str
) -> None:
    """Before: the name went into the tool schemas, where a model's API refuses it (or
    ``</tool_call>`` in it broke the tool-call text)."""
    spec = listing([{"name": name, "inputSchema": OBJECT}, {"name": "fine", "inputSchema": OBJECT}])
    with pytest.raises(ConfigError) as caught:
        MCPToolEnv([spec], tasks=TASK)
    message = str(caught.value)
    assert message.startswith(f"MCP server {spec.label!r} lists tool {name!r}, and")
    assert message.endswith("leave it out with MCPServer(tools=[...]) or fix the server")
    kept = dataclasses.replace(spec, tools=["fine"])  # the fix the error names
    assert list(MCPToolEnv([kept], tasks=TASK).tools) == ["fine"]


def test_a_prefix_that_makes_a_name_too_long_asks_for_a_shorter_prefix(
    listing: Callable[..., MCPServer],
) -> None:
    spec = listing([{"name": "x" * 60, "inputSchema": OBJECT}])
    long = dataclasses.replace(spec, prefix="toolbox_")
    with pytest.raises(ConfigError, match="give a shorter prefix$"):
        MCPToolEnv([long], tasks=TASK)
    assert list(MCPToolEnv([spec], tasks=TASK).tools) == ["x" * 60]


# ---- 6. why a server did not start ------------------------------------------------------------


def test_an_unreachable_url_says_it_could_not_be_reached() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there
    with pytest.raises(MCPServerError) as caught:
        MCPToolEnv([MCPServer(url=url, start_timeout=20)], tasks=TASK)
    message = str(caught.value)
    assert message.startswith(f"MCP server {url!r} could not be reached (ConnectError")
    assert "\n" not in message


# ---- 7. the documented git server stays in its workspace copy ---------------------------------


@pytest.mark.parametrize(
    "path", [ROOT / "docs" / "envs" / "mcp.md", ROOT / "agentgym" / "mcp" / "_spec.py"]
)
def test_the_documented_git_server_is_confined_to_its_workspace(path: Path) -> None:
    """Without ``--repository {workspace}`` the model's ``git_commit`` with the template's path
    commits into the template, which every later episode then starts from."""
    examples = re.findall(r"MCPServer\(command=\"[^\"]*mcp-server-git\".*?\)", path.read_text(),
                          re.DOTALL)  # fmt: skip
    assert examples and all("workspace=" in e for e in examples)
    assert all('args=["--repository", "{workspace}"]' in e for e in examples), examples

"""Helpers of the MCP tests: a tiny misbehaving server, tool-call text, a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import end_process, require

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_SERVER = ROOT / "examples" / "mcp_server.py"

#: A server of the tests whose tools misbehave on purpose. It appends its pid to $PID_FILE
#: when it starts, and `slow` touches $STARTED_FILE before it waits.
MISBEHAVING_SERVER = textwrap.dedent('''
    import os
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("misbehaving", log_level="WARNING")

    @server.tool()
    def pid() -> str:
        """This server's process id."""
        return str(os.getpid())

    @server.tool()
    def crash() -> str:
        """Kill this server at once."""
        os._exit(3)

    @server.tool()
    async def slow() -> str:
        """Say it started, then wait an hour."""
        open(os.environ["STARTED_FILE"], "w").close()
        await anyio.sleep(3600)
        return "woke up"

    @server.tool()
    def refuse(reason: str) -> str:
        """Answer with an error result (isError)."""
        raise ToolError(reason)

    with open(os.environ["PID_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    server.run()
''')


@pytest.fixture(autouse=True)
def _mcp_sdk() -> Iterator[None]:
    """Every MCP test needs the SDK; shared servers a test started are stopped after it."""
    require("mcp")
    from agentgym.mcp import close_shared_servers

    yield
    close_shared_servers()


@contextmanager
def example_notes_server() -> Iterator[str]:
    """``examples/mcp_server.py --http PORT`` on a free port, polled until it listens; its URL.

    Killed if it ignores the terminate; a server that died (its port taken) fails at once
    rather than letting another process's listener answer for it.
    """
    from agentgym.engine._serve import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(EXAMPLE_SERVER), "--http", str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:  # poll until it accepts connections
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, f"the example server exited {proc.returncode}"
                assert time.monotonic() < deadline, "the HTTP server did not listen in time"
            with pytest.raises(subprocess.TimeoutExpired):  # still running: poll again
                proc.wait(timeout=0.05)
        assert proc.poll() is None, "the example server exited: another process holds its port"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        end_process(proc)


def venv_server(name: str) -> str:
    """The path of a published reference server installed next to this Python."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        from tests.conftest import skip_or_fail

        skip_or_fail(f"{name} is not installed (the 'test' extra installs it)")
    return str(path)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

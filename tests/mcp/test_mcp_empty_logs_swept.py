"""The default stderr logs of MCP servers (``agentgym-logs/mcp-PID-NAME.log``) of a killed
process: the empty ones go with the next process's first server, the others stay.

Before: only the exit hook removed a process's empty logs, so each process killed with
SIGKILL (or SIGTERM without agentgym's CLI) left one per server for good (48 empty ones of
123 on the machine this was found on).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from agentgym.mcp import MCPServer, _connection
from agentgym.mcp._connection import checkout, on_hub
from tests.mcp.conftest import ROOT
from tests.mcp.test_mcp_spec_and_start import NOISY_SERVER

#: The line of `NOISY_SERVER` that writes to stderr: a quiet server is one without it.
NOISE = 'print("NOISE at start", file=sys.stderr, flush=True)'

#: Starts a quiet server and a noisy one (default stderr: the log files), says "ready", waits.
KILLED_PARENT = textwrap.dedent("""
    import asyncio, sys
    from agentgym.mcp import MCPServer
    from agentgym.mcp._connection import checkout

    async def main():
        for script in sys.argv[1:]:
            await checkout(MCPServer(command=sys.executable, args=[script]))
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_the_empty_logs_of_a_killed_process_go_and_the_others_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet, noisy, temp = tmp_path / "quiet_server.py", tmp_path / "noisy_server.py", tmp_path / "t"
    quiet.write_text(NOISY_SERVER.replace(NOISE, ""))
    noisy.write_text(NOISY_SERVER)
    temp.mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", KILLED_PARENT, str(quiet), str(noisy)], cwd=ROOT,
        stdout=subprocess.PIPE, env={**os.environ, "TMPDIR": str(temp)},
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == b"ready"
    finally:
        parent.kill()
        parent.wait(timeout=30)
    logs = temp / "agentgym-logs"
    left = {p.name: p.stat().st_size for p in logs.iterdir()}
    assert sorted(left.values()) == [0, len("NOISE at start\n")]  # no exit hook ran
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    spec = MCPServer(command=sys.executable, args=[str(noisy)])
    connection = await checkout(spec)
    try:
        assert spec.log_path is not None
        kept = [name for name, size in left.items() if size]
        assert sorted(p.name for p in logs.iterdir()) == sorted([*kept, Path(spec.log_path).name])
    finally:
        await on_hub(connection.close())
        _connection.close_shared_servers()

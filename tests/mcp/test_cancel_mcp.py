"""Cancelling an episode while its MCP server is still starting (the handshake not done)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from agentgym import EpisodeSpec, ScriptedPolicy, run_episode
from agentgym.mcp import MCPServer, MCPToolEnv, _connection, close_shared_servers
from tests.mcp.conftest import MISBEHAVING_SERVER, pid_alive
from tests.mcp.test_mcp_lifecycle import TASK, until

#: Once $HANG_FILE exists, a new server says its pid and never answers the handshake.
HANGING_START = '''
import os, time
if os.path.exists(os.environ["HANG_FILE"]):
    with open(os.environ["PID_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(3600)
'''


@pytest.mark.parametrize("scope", ["episode", "shared"])
async def test_an_episode_cancelled_while_its_server_starts_stops_that_server(
    tmp_path: Path, scope: str
) -> None:
    script = tmp_path / "server.py"
    script.write_text(HANGING_START + MISBEHAVING_SERVER)
    pid_file, hang = tmp_path / "pids", tmp_path / "hang"
    spec = MCPServer(
        command=sys.executable, args=[str(script)], scope=scope, start_timeout=120,
        env={"PID_FILE": str(pid_file), "STARTED_FILE": str(tmp_path / "s"),
             "HANG_FILE": str(hang)},
    )  # fmt: skip
    envs = [MCPToolEnv([spec], tasks=TASK)]  # lists the tools with a server that answers
    close_shared_servers()  # the shared one too: the episode must start its own
    hang.touch()
    pids = lambda: [int(p) for p in pid_file.read_text().split()]  # noqa: E731
    started = len(pids())

    episode = asyncio.create_task(
        run_episode(lambda: envs[0], ScriptedPolicy(["x"]), EpisodeSpec(0, 0, 0, seed=0))
    )
    await until(lambda: len(pids()) > started)  # the server runs; the handshake is pending
    pid = pids()[-1]
    assert pid_alive(pid) and not episode.done()
    episode.cancel()
    with pytest.raises(asyncio.CancelledError):
        await episode
    await until(lambda: not pid_alive(pid))  # the half-started server is gone
    assert envs[0]._connections == [None]
    assert not _connection._shared, "a session that never opened is kept as the shared one"
    hang.unlink()  # the next episode gets a working server: nothing of this one is held
    t = await asyncio.wait_for(
        run_episode(lambda: envs[0], ScriptedPolicy(["x"]), EpisodeSpec(0, 0, 0, seed=0)), 60
    )
    assert t.status == "ok", t.error

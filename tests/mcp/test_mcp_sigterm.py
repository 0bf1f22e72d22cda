"""``kill`` of an ``agentgym`` command (SIGTERM: a job queue's cancel, ``docker stop``) unwinds
it as Ctrl-C does. It ended the process on the spot: an MCP server busy in a call, started
in a session of its own, outlived the eval, and so did its workspace copy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import hermes_call
from tests.mcp.conftest import MISBEHAVING_SERVER, pid_alive

AGENTGYM = str(Path(sys.executable).with_name("agentgym"))

USER_MODULE = """
import sys
from agentgym import register
from agentgym.mcp import MCPServer, MCPToolEnv

class SlowEnv(MCPToolEnv):
    def __init__(self, **kwargs):
        server = MCPServer(command=sys.executable, args=[{script!r}],
                           env={{"PID_FILE": {pids!r}, "STARTED_FILE": {started!r}}})
        super().__init__([server], tasks=[{{"prompt": "wait"}}], **kwargs)

    def reference_turns(self, task):
        return [{call!r}, "done"]

register("sig/Slow-v0", SlowEnv)
"""


def wait_for(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_killed_eval_stops_the_server_busy_in_a_call(tmp_path: Path) -> None:
    script, pids, started = tmp_path / "server.py", tmp_path / "pids", tmp_path / "started"
    script.write_text(MISBEHAVING_SERVER)
    (tmp_path / "sigmod.py").write_text(USER_MODULE.format(
        script=str(script), pids=str(pids), started=str(started), call=hermes_call("slow")))
    env = {**os.environ, "AGENTGYM_RUNS_DB": f"sqlite:///{tmp_path / 'runs.db'}"}
    proc = subprocess.Popen([AGENTGYM, "eval", "sigmod:sig/Slow-v0", "-n", "1", "--out", "ev"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(started.exists)  # the server is in the call, which waits an hour
        servers = [int(p) for p in pids.read_text().split()]  # the listing's, the episode's
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted: 0 of 1 episodes are in" in stderr and "--resume" in stderr, stderr
    wait_for(lambda: not any(pid_alive(pid) for pid in servers), 10)

"""A checkout cancelled just as its episode's MCP session opened on the hub.

The window: the hub's `connect` has returned the open session, but the future the caller
awaits has not taken it yet (the hub runs the callback that hands it over a moment later).
The caller's cancel landed there cancelled that future, whose result the hub then dropped: the
session, and its server process, ran on for nobody until the interpreter exited.

The test places the cancel in that window exactly: every start slot but one is held, so a
hub task waiting for a slot is woken by the checkout's own `connect` releasing its slot, and
runs (and blocks the hub) before the hand-over callback.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest

from agentgym.mcp import MCPServer, _connection
from tests.mcp.conftest import MISBEHAVING_SERVER, pid_alive
from tests.mcp.test_mcp_lifecycle import until

#: The server says it runs ($WAITING_FILE), then starts serving once $GO_FILE exists.
GATED_START = """
import os, time
open(os.environ["WAITING_FILE"], "w").close()
while not os.path.exists(os.environ["GO_FILE"]):
    time.sleep(0.01)
"""


async def test_a_checkout_cancelled_as_its_session_opened_closes_that_session(
    tmp_path: Path,
) -> None:
    script = tmp_path / "server.py"
    script.write_text(GATED_START + MISBEHAVING_SERVER)
    pid_file, waiting, go = tmp_path / "pids", tmp_path / "waiting", tmp_path / "go"
    spec = MCPServer(
        command=sys.executable, args=[str(script)], scope="episode", start_timeout=120,
        env={"PID_FILE": str(pid_file), "STARTED_FILE": str(tmp_path / "s"),
             "WAITING_FILE": str(waiting), "GO_FILE": str(go)},
    )  # fmt: skip
    held = _connection.MAX_STARTING - 1
    queued, paused, resume = threading.Event(), threading.Event(), threading.Event()

    async def hold_slots() -> set[_connection.MCPConnection]:
        for _ in range(held):
            await _connection._start_slots().acquire()
        return set(_connection._live)

    async def next_in_line() -> None:
        """Wait for the checkout's slot; once woken, hold the hub until the cancel is in."""
        slots = _connection._start_slots()
        assert slots.locked(), "the checkout should hold the last start slot"
        queued.set()  # `acquire` below queues this task in the same step
        async with slots:
            paused.set()
            resume.wait(60)  # blocks the hub loop: the hand-over callback waits behind it

    async def release_slots() -> None:
        for _ in range(held):
            _connection._start_slots().release()

    async def unclosed() -> list[_connection.MCPConnection]:
        """Sessions opened here and not closed, once the closes asked for have ended."""
        opened = [c for c in _connection._live if c not in before]
        await asyncio.gather(*(asyncio.shield(c._closing) for c in opened if c._closing))
        return [c for c in opened if c._closing is None]

    before = await _connection.on_hub(hold_slots())
    checking_out = asyncio.create_task(_connection.checkout(spec))
    try:
        await until(waiting.exists)  # the server process runs: the checkout holds its slot
        waiter = asyncio.wrap_future(_connection._submit(next_in_line()))
        assert await asyncio.to_thread(queued.wait, 30)
        go.touch()  # the handshake completes; the checkout's connect returns on the hub
        # waited for here, blocking this loop too: the checkout must not take its session
        # before the cancel, which lands while the caller still awaits it
        assert paused.wait(60)
        checking_out.cancel()
        with pytest.raises(asyncio.CancelledError):
            await checking_out
    finally:
        resume.set()
        await _connection.on_hub(release_slots())
    await waiter

    leaked = await _connection.on_hub(unclosed())
    pid = int(pid_file.read_text().split()[-1])
    try:
        assert not leaked, "the session opened for the cancelled checkout is still open"
        await until(lambda: not pid_alive(pid))  # its server is gone too
    finally:
        await _connection.on_hub(_connection.close_all(leaked))

"""``agentgym serve`` while another process holds the database's write lock, and cancels of
command-line runs whose process is gone.

A real server subprocess on loopback over a SQLite file (`tests.serve.test_api.api_server`);
the lock is taken by a plain ``sqlite3`` connection, as another ``agentgym`` process would.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentgym.runs import RunStore
from tests.runs.test_probe_fixes_serve_queue import write_lock
from tests.serve.test_api import Server, api_server

pytestmark = pytest.mark.slow  # starts a server subprocess

#: Longest answer accepted while the lock is held (they take ~0.05 s; a request that waits
#: for the lock gets none before the client's 3 x ANSWER_S): the slowest of some hundred
#: requests to a server process, on a saturated machine too.
ANSWER_S = 5.0
#: How long requests are made while the lock is held: several of the queue's polls (0.5 s).
LOCKED_FOR_S = 3.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("serve-locked")
    with api_server(f"sqlite:///{root / 'runs.db'}", root) as running:
        yield running


def cli_run(server: Server, status: str, pid: int) -> str:
    """A command-line run's row (no job) in the server's database."""
    store = RunStore(server.db_url)
    try:
        return store.create_run(kind="eval", name="cli", config={}, source="cli",
                                status=status, pid=pid, host="here")  # fmt: skip
    finally:
        store.close()


def test_a_held_write_lock_does_not_freeze_the_server(server: Server) -> None:
    """The queue polled the database on the event loop and every read began ``BEGIN
    IMMEDIATE``: while another process held the lock, ``/health`` and static files (which
    read no database) waited as long as the lock, up to the 30 s busy timeout."""
    run_id = cli_run(server, "finished", pid=1)
    paths = ["/health", "/static/dashboard.css", "/jobs", f"/jobs/{run_id}", "/api/runs",
             f"/jobs/{run_id}/logs"]  # fmt: skip
    slowest: dict[str, float] = {}
    database = Path(server.db_url.removeprefix("sqlite:///"))
    with write_lock(database), httpx.Client(base_url=server.url, timeout=3 * ANSWER_S) as client:
        deadline = time.monotonic() + LOCKED_FOR_S
        while time.monotonic() < deadline:
            for path in paths:
                start = time.monotonic()
                try:
                    response = client.get(path)
                except httpx.TimeoutException:
                    pytest.fail(f"GET {path} got no answer while the database was locked")
                assert response.status_code == 200, (path, response.text)
                took = time.monotonic() - start
                slowest[path] = max(slowest.get(path, 0.0), took)
    assert max(slowest.values()) < ANSWER_S, slowest


@pytest.mark.parametrize("status", ["interrupted", "cancelled"])
def test_cancelling_an_ended_command_line_run_says_it_ended(server: Server, status: str) -> None:
    """An interrupted CLI run (its process killed) was answered "stop its process (pid N)
    instead": a dead pid, or by then another process's."""
    run_id = cli_run(server, status, pid=2_000_000_000)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.post(f"/jobs/{run_id}/cancel")
        assert response.status_code == 409, response.text
        assert f"already {status}; nothing to cancel" in response.json()["detail"]
        assert "pid" not in response.text
        assert client.get(f"/jobs/{run_id}").json()["status"] == status  # left as it was

"""``agentgym serve`` killed with SIGKILL mid-job and started again; refusals at start; tokens.

The restart tests run against SQLite and a real PostgreSQL server, like `test_api`.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import skip_or_fail
from tests.runs.postgres import BACKENDS, backend_url
from tests.serve.test_api import (
    AGENTGYM,
    JOB_TIMEOUT_S,
    LONG,
    _alive,
    api_server,
    episodes,
    job,
    submit,
    wait_for,
    wait_running_with_episodes,
    wait_status,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", BACKENDS)
def test_server_killed_mid_job_interrupts_it_and_resumes_it_on_restart(
    backend: str, tmp_path: Path
) -> None:
    db_url = backend_url(backend, tmp_path)
    with api_server(db_url, tmp_path, name="first") as first:
        with httpx.Client(base_url=first.url, timeout=30) as client:
            long = submit(client, LONG)
            before = wait_running_with_episodes(client, long["id"])
        first.proc.kill()  # SIGKILL: no shutdown hook runs; the worker is orphaned
        first.proc.wait()
    with api_server(db_url, tmp_path, name="second") as second:
        with httpx.Client(base_url=second.url, timeout=30) as client:
            resumed = wait_for(
                lambda: (j := job(client, long["id"]))["attempt"] == 2
                and j["status"] == "running" and j["pid"] and j,
                JOB_TIMEOUT_S, "the re-queued job to run again",
            )  # fmt: skip
            assert resumed["resume"] is True and resumed["pid"] != before["pid"]
            assert not _alive(before["pid"])  # the orphan was stopped before the resume
            played = len(episodes(resumed["run_dir"]))
            wait_for(lambda: len(episodes(resumed["run_dir"])) > played + 3, JOB_TIMEOUT_S,
                     "the resumed job to play on")  # fmt: skip
            keys = episodes(resumed["run_dir"])
            assert len(keys) == len(set(keys))  # continued after its episodes, none twice
            assert "--- attempt 2" in client.get(f"/jobs/{long['id']}/logs").text
            client.post(f"/jobs/{long['id']}/cancel")
            wait_status(client, long["id"], "cancelled")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_job_without_checkpoint_stays_interrupted(backend: str, tmp_path: Path) -> None:
    db_url = backend_url(backend, tmp_path)
    with contextlib.closing(socket.socket()) as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        model_url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        config = {"env": "calculator", "num_tasks": 1, "policy": "openai", "model": "m",
                  "base_url": model_url}  # fmt: skip
        with api_server(db_url, tmp_path, name="first") as first:
            with httpx.Client(base_url=first.url, timeout=30) as client:
                hung = submit(client, config)
                before = wait_for(
                    lambda: (j := job(client, hung["id"]))["status"] == "running" and j["pid"]
                    and j, JOB_TIMEOUT_S, "the job to start",
                )  # fmt: skip
            first.proc.kill()
            first.proc.wait()
        assert episodes(before["run_dir"]) == []
        with api_server(db_url, tmp_path, name="second") as second:
            with httpx.Client(base_url=second.url, timeout=30) as client:
                after = wait_status(client, hung["id"], "interrupted")
                assert (after["attempt"], after["resume"]) == (1, False)
                wait_for(lambda: not _alive(before["pid"]), 30, "the orphan to be stopped")
                assert job(client, hung["id"])["status"] == "interrupted"


def test_a_stopped_server_interrupts_its_jobs_and_requeues_them(tmp_path: Path) -> None:
    from agentgym.runs import RunStore  # after test_api's require("sqlalchemy")

    db_url = f"sqlite:///{tmp_path / 'runs.db'}"
    with api_server(db_url, tmp_path, name="first") as first:
        with httpx.Client(base_url=first.url, timeout=30) as client:
            long = submit(client, LONG)
            before = wait_running_with_episodes(client, long["id"])
            with client.stream("GET", f"/jobs/{long['id']}/logs", params={"follow": True}):
                first.proc.terminate()  # graceful: even with a log being followed
                first.proc.wait(timeout=60)  # uvicorn re-raises the SIGTERM once it stopped
    assert not _alive(before["pid"])
    store = RunStore(db_url)
    stopped = store.get_run(long["id"])  # interrupted, then re-queued
    store.close()
    # the job's worker unwound on the SIGTERM (`exit_on_sigterm`): 128 + 15
    assert (stopped["status"], stopped["exit_code"], stopped["resume"]) == ("queued", 143, True)
    with api_server(db_url, tmp_path, name="second") as second:
        with httpx.Client(base_url=second.url, timeout=30) as client:
            again = wait_running_with_episodes(
                client, long["id"], len(episodes(before["run_dir"])) + 1
            )
            assert (again["attempt"], again["resume"]) == (2, True)
            client.post(f"/jobs/{long['id']}/cancel")
            wait_status(client, long["id"], "cancelled")


def test_a_taken_port_and_an_exposed_bind_without_token_are_refused(tmp_path: Path) -> None:
    with contextlib.closing(socket.socket()) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        command = [*AGENTGYM, "serve", "--port", port, "--db", str(tmp_path / "x.db")]
        refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert f"port {port} on 127.0.0.1 is in use" in refused.stderr
    exposed = subprocess.run([*AGENTGYM, "serve", "--host", "0.0.0.0", "--port", "0"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert exposed.returncode == 2 and "--token" in exposed.stderr
    assert "Traceback" not in refused.stderr + exposed.stderr


def test_another_address_needs_the_token(tmp_path: Path) -> None:
    address = _non_loopback_address()
    db_url = f"sqlite:///{tmp_path / 'runs.db'}"
    with api_server(db_url, tmp_path, "--host", "0.0.0.0", "--token", "s3cret") as server:
        port = server.url.rsplit(":", 1)[1]
        base = f"http://{address}:{port}"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            for path in ("/jobs", "/openapi.json"):
                response = httpx.get(base + path, headers=headers, timeout=30)
                assert response.status_code == 401, (path, headers)
                assert "Bearer" in response.json()["detail"]
        good = httpx.get(base + "/jobs", headers={"Authorization": "Bearer s3cret"}, timeout=30)
        assert good.status_code == 200 and good.json() == []
        for scheme in ("bearer", "BEARER"):  # RFC 7235: the scheme is case-insensitive
            lower = httpx.get(base + "/jobs", headers={"Authorization": f"{scheme} s3cret"},
                              timeout=30)  # fmt: skip
            assert lower.status_code == 200, scheme
        other = httpx.get(base + "/jobs", headers={"Authorization": "Basic s3cret"}, timeout=30)
        assert other.status_code == 401
        # a browser cannot send the header: it signs in once with ?token=, then has a cookie
        assert httpx.get(base + "/?token=wrong", timeout=30).status_code == 401
        with httpx.Client(base_url=base, timeout=30) as browser:
            signed_in = browser.get("/?token=s3cret&x=1")
            assert signed_in.status_code == 303
            assert signed_in.headers["location"] == f"{base}/?x=1"  # the token leaves the URL
            cookie = signed_in.headers["set-cookie"].lower()
            assert "httponly" in cookie and "samesite=strict" in cookie
            assert browser.get("/").status_code == 200  # the dashboard, by the cookie
            assert browser.get("/jobs").json() == []


def _non_loopback_address() -> str:
    """This machine's address on its default route (a UDP connect sends nothing)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as s:
        try:
            s.connect(("192.0.2.123", 9))
        except OSError:
            skip_or_fail("no non-loopback IPv4 address on this machine")
        address = str(s.getsockname()[0])
    if address.startswith("127."):
        skip_or_fail("no non-loopback IPv4 address on this machine")
    return address

"""``agentgym sweep``: a bad config leaves no rows, a stopped sweep stops its jobs, and its runs
are named by their grid values and listed in the grid's order.

The real console script and its real workers (``agentgym eval`` subprocesses), against a SQLite
file of the test's own; a stopped sweep's job plays against a model server that never answers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require, serve_in_thread
from tests.runs.cli import AGENTGYM, agentgym

require("sqlalchemy")
from agentgym._pid import process_alive  # noqa: E402
from agentgym.runs import RunStore  # noqa: E402
from agentgym.runs._cli import _sweep_configs  # noqa: E402

pytestmark = pytest.mark.slow


def test_one_bad_config_stops_the_sweep_with_no_rows(tmp_path: Path, db: str) -> None:
    """The configs checked before the bad one were left ``queued``, for no queue to run."""
    config = tmp_path / "ev.yaml"
    config.write_text("env: calculator\nnum_tasks: 2\n")
    grid = agentgym("sweep", config, "--kind", "eval", "--grid", "num_tasks=1,2,0", db=db)
    assert grid.returncode == 2 and RunStore(db).list_runs() == [], grid.stderr
    assert "error: ev-num_tasks=0: " in grid.stderr  # which run of the grid
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "a.yaml").write_text("kind: eval\nenv: calculator\n")
    (folder / "b.yaml").write_text("kind: eval\nenv: calculatr\n")
    (folder / "c.yaml").write_text("kind: eval\nenv: calculator\nnum_tasks: [1, 3]\n")
    files = agentgym("sweep", folder, db=db)
    assert files.returncode == 2 and RunStore(db).list_runs() == [], files.stderr
    assert "error: b: unknown env 'calculatr'" in files.stderr  # which file
    (folder / "b.yaml").unlink()  # the list of c.yaml: one value, else click kept the last
    listed = agentgym("sweep", folder, db=db)
    assert listed.returncode == 2 and "'num_tasks' takes one value" in listed.stderr
    assert RunStore(db).list_runs() == []


def test_runs_are_named_by_their_grid_values_in_the_grids_order(tmp_path: Path, db: str) -> None:
    """They were ``ev-0, ev-1 ...``, and the table, sorted as text, put ev-10 before ev-2."""
    config = tmp_path / "ev.yaml"
    config.write_text("env: calculator\nnum_tasks: 1\n")
    swept = agentgym("sweep", config, "--kind", "eval", "--grid", "seed=2,10", "--runs-dir",
                     tmp_path / "runs", db=db)  # fmt: skip
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert 0 < swept.stdout.index("ev-seed=2 ") < swept.stdout.index("ev-seed=10 ")
    assert sorted(run["name"] for run in RunStore(db).list_runs()) == ["ev-seed=10", "ev-seed=2"]


def test_a_name_is_short_and_safe_in_a_file_name(tmp_path: Path) -> None:
    config = tmp_path / f"{'x' * 220}.yaml"
    config.write_text("env: calculator\n")
    runs = _sweep_configs(config, ["env_kwargs={a: 1}", "tasks=0:5,5:9"], "eval")
    names = [run.name for run in runs]
    assert len(set(names)) == 2 and all(len(name) <= 80 for name in names)
    assert all(name.replace("=", "").replace(",", "").replace("~", "").replace("_", "")
               .replace("-", "").replace(".", "").isalnum() for name in names)  # fmt: skip
    short = tmp_path / "ev.yaml"
    short.write_text("env: calculator\n")
    [run] = _sweep_configs(short, ["env_kwargs={a: 1}"], "eval")
    assert run.name == "ev-env_kwargs=__a__1_"  # the JSON's braces and quotes: not in a name


@pytest.fixture
def silent_server() -> Iterator[tuple[str, threading.Event]]:
    """An OpenAI-compatible server that lists a model and never answers a completion.

    Yields its base URL and an event set once a completion was asked for (a job is playing).
    """
    asked, release = threading.Event(), threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]})
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def do_POST(self) -> None:
            asked.set()
            release.wait(600)  # the job hangs on its model until it is stopped

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    serve_in_thread(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", asked
    finally:
        release.set()
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_sweep_stops_its_job_and_cancels_the_rest(
    tmp_path: Path, db: str, silent_server: tuple[str, threading.Event], sig: signal.Signals
) -> None:
    """Killed, the sweep left its running job (its own session) writing its folder
    unsupervised, and its other jobs ``queued`` forever."""
    base_url, asked = silent_server
    config = tmp_path / "slow.yaml"
    config.write_text(f"kind: eval\nenv: calculator\npolicy: openai\nbase_url: {base_url}\n"
                      "model: m\nnum_tasks: 1\n")  # fmt: skip
    env = {**os.environ, "AGENTGYM_RUNS_DB": db, "COLUMNS": "250", "OPENAI_API_KEY": "x"}
    sweep = subprocess.Popen(
        [str(AGENTGYM), "sweep", str(config), "--grid", "seed=1,2,3", "--runs-dir",
         str(tmp_path / "runs")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert asked.wait(120), "the sweep's first job never asked its model"
        store = RunStore(db)
        [worker] = [run["pid"] for run in store.list_runs() if run["status"] == "running"]
        sweep.send_signal(sig)
        out, err = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 128 + sig, out + err
    assert worker and not process_alive(worker), "the sweep's job runs on without it"
    runs = {run["name"]: run for run in store.list_runs()}
    assert runs["slow-seed=1"]["status"] == "interrupted"
    for name in ("slow-seed=2", "slow-seed=3"):
        assert runs[name]["status"] == "cancelled" and runs[name]["ended_at"]
        assert f"agentgym sweep was stopped ({sig.name})" in runs[name]["error_tail"]
    assert "Traceback" not in err

"""``agentgym serve`` on a run database it cannot open: one line, exit code 2, no server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentgym.engine._serve import free_port
from tests.conftest import require

AGENTGYM = [sys.executable, "-c", "from agentgym.cli import main; main()"]


def test_an_unreachable_database_is_refused_in_one_line(tmp_path: Path) -> None:
    require("sqlalchemy")
    dead = "postgresql+psycopg://nobody:pw-s3cret@127.0.0.1:1/none"  # port 1 refuses at once
    port = str(free_port())
    env = {**os.environ, "AGENTGYM_HOME": str(tmp_path)}
    env.pop("AGENTGYM_RUNS_DB", None)
    # were the database opened, the server would run for ever: the timeout ends the test
    proc = subprocess.run(
        [*AGENTGYM, "serve", "--port", port, "--db", dead],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: cannot open the runs database"), proc.stderr
    assert "127.0.0.1:1" in lines[0] and "--db" in lines[0]
    assert "Traceback" not in proc.stderr and "listening on" not in proc.stdout + proc.stderr
    assert "pw-s3cret" not in proc.stdout + proc.stderr

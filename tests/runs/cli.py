"""The ``agentgym`` console script as the run-store tests run it: a database of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AGENTGYM = Path(sys.executable).parent / "agentgym"


def agentgym(*args: str | Path, db: str) -> subprocess.CompletedProcess[str]:
    """The console script with ``db`` as its run store, wide enough not to wrap a line."""
    env = {**os.environ, "AGENTGYM_RUNS_DB": db, "COLUMNS": "250", "NO_COLOR": "1",
           "TERM": "dumb"}  # fmt: skip
    return subprocess.run(
        [str(AGENTGYM), *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )

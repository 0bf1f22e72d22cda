"""What ``import agentgym.cli`` loads: every command pays for it, even ``agentgym --help``.

SQLAlchemy (~0.3 s of a ~1.3 s import) is only needed by commands that open the run store, so
`agentgym.runs._store` imports it when a `RunStore` is made. The store commands themselves run
end to end in ``tests/runs/test_track.py`` (``test_runs_ls_show_and_compare``, through the
console script in a fresh process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: Loaded only by the commands that use the run store (its database and its tables).
STORE_ONLY = ("sqlalchemy", "agentgym.runs._schema")

_PROBE = f"""
import json, sys
import agentgym.cli
loaded = lambda: [m for m in {STORE_ONLY!r} if m in sys.modules]
at_import = loaded()
from agentgym.runs import RunStatus, RunStore
store = RunStore(sys.argv[1])
run_id = store.create_run(kind="eval", name="probe", config={{}}, source="cli")
store.update_run(run_id, status=RunStatus.finished)
print(json.dumps([at_import, loaded(), store.get_run(run_id)["status"]]))
"""


def test_importing_the_cli_leaves_the_run_store_database_unloaded(tmp_path: Path) -> None:
    """``agentgym check`` or ``--help`` never opens the store: it must not import SQLAlchemy.

    The same process then opens a store, so the names looked for are the ones that load (the
    check cannot pass on a misspelt name) and the store still works when imported late.
    """
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, f"sqlite:///{tmp_path / 'runs.db'}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    at_import, after_store, status = json.loads(proc.stdout)
    assert at_import == []
    assert after_store == list(STORE_ONLY)
    assert status == "finished"

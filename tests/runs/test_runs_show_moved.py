"""``agentgym runs show`` of a run whose folder was moved: says where the row points
and how to reach the run, by its id or by its new folder."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import require
from tests.runs.cli import agentgym

require("sqlalchemy")
from agentgym.runs import RunStore  # noqa: E402


def test_a_moved_folder_is_named_by_id_and_by_its_new_path(tmp_path: Path, db: str) -> None:
    old, new = tmp_path / "ev1", tmp_path / "moved"
    played = agentgym("eval", "calculator", "-n", "1", "--out", old, db=db)
    assert played.returncode == 0, played.stderr
    run_id = RunStore(db).list_runs()[0]["id"]
    old.rename(new)
    by_id = agentgym("runs", "show", run_id, db=db)
    assert by_id.returncode == 0, by_id.stderr
    assert f"its folder {old} is gone (moved or deleted?)" in by_id.stdout
    by_folder = agentgym("runs", "show", new, db=db)
    assert by_folder.returncode == 2
    line = by_folder.stderr.strip()
    assert "\n" not in line and f"runs whose folder is gone: run {run_id} had {old}" in line

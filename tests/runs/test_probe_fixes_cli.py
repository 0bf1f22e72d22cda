"""``agentgym runs``: other people's text shown safely, one rule for folders vs id prefixes, and a
run whose folder is gone said to be gone.

The real console script against a SQLite file of the test's own (``AGENTGYM_RUNS_DB``); rows are
made with `RunStore` (what the CLI hook writes) and folders hold hand-made episodes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agentgym._trajectory import to_json_line
from tests.conftest import require
from tests.runs.cli import AGENTGYM
from tests.runs.test_runs_episodes import episode

require("sqlalchemy")
from agentgym.runs import RunStatus, RunStore  # noqa: E402
from agentgym.runs._store import now_iso  # noqa: E402

#: What a model (or a name, or a log line) could hold: clear screen, conceal, OSC 52 clipboard.
HOSTILE = "\x1b[2J\x1b[8mhidden\x1b]52;c;cm0gLXJmIH4K\x07"


def runs_cli(*args: str | Path, db: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`tests.runs.cli.agentgym`, run from ``cwd`` (a relative folder argument is read there)."""
    env = {**os.environ, "AGENTGYM_RUNS_DB": db, "COLUMNS": "250", "NO_COLOR": "1",
           "TERM": "dumb"}  # fmt: skip
    return subprocess.run([str(AGENTGYM), *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)  # fmt: skip


def eval_folder(folder: Path, reply: str, error: str | None = None) -> Path:
    """``folder`` holding one eval episode whose assistant wrote ``reply``."""
    folder.mkdir(parents=True)
    line = to_json_line(episode("ok", 1.0, reply, error=error))
    (folder / "trajectories.jsonl").write_text(line if line.endswith("\n") else line + "\n")
    return folder


def indexed(store: RunStore, folder: Path, run_id: str, **values: object) -> str:
    """A finished eval row for ``folder`` (as the CLI hook writes it)."""
    return store.create_run(
        kind="eval", name=values.pop("name", folder.name), config={"env": "calculator"},
        source="cli", status=values.pop("status", RunStatus.finished), run_dir=folder.resolve(),
        run_id=run_id, started_at=now_iso(), **values,
    )  # fmt: skip


def test_escape_sequences_in_episodes_names_and_logs_are_shown_not_sent(
    tmp_path: Path, db: str
) -> None:
    """They reached the terminal raw: a model's reply could clear the screen or set the
    clipboard of whoever read its episodes."""
    folder = eval_folder(tmp_path / "ev", f"The answer is 90.{HOSTILE}", error=f"boom{HOSTILE}")
    run_id = indexed(RunStore(db), folder, "a1a1a1a1a1a1", name=f"ev{HOSTILE}",
                     error_tail=f"Traceback{HOSTILE}\n\tline two")  # fmt: skip
    outputs = {}
    for args in (("episodes", folder), ("episodes", run_id), ("show", run_id), ("ls",)):
        shown = runs_cli("runs", *args, db=db, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout, args
        outputs[args[0]] = shown.stdout
    episodes = outputs["episodes"]
    assert "The answer is 90.\\x1b[2J\\x1b[8mhidden\\x1b]52;c;cm0gLXJmIH4K\\x07" in episodes
    assert "error: boom\\x1b[2J" in episodes and "[assistant]\n" in episodes  # newlines kept
    assert "ev\\x1b[2J" in outputs["show"] and "Traceback\\x1b[2J" in outputs["show"]
    assert "line two" in outputs["show"] and "\\x09" not in outputs["show"]  # tabs kept
    assert "ev\\x1b[2J" in outputs["ls"]


def test_a_folder_named_like_an_id_prefix_means_the_folder_to_every_command(
    tmp_path: Path, db: str
) -> None:
    """``runs show d7`` showed the run whose id starts with d7, while ``runs episodes d7`` and
    ``runs doctor d7`` read the folder d7: one argument, two runs."""
    store = RunStore(db)
    other = indexed(store, eval_folder(tmp_path / "other", "other's reply"), "d7aaaaaaaaaa")
    mine = indexed(store, eval_folder(tmp_path / "d7", "my reply"), "0b0b0b0b0b0b")
    shown = runs_cli("runs", "show", "d7", db=db, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"run {mine}" in shown.stdout and other not in shown.stdout
    episodes = runs_cli("runs", "episodes", "d7", db=db, cwd=tmp_path)
    assert episodes.returncode == 0 and "my reply" in episodes.stdout, episodes.stderr
    compared = runs_cli("runs", "compare", "d7", "d7a", db=db, cwd=tmp_path)  # more: the id
    assert compared.returncode == 0, compared.stderr
    assert mine in compared.stdout and other in compared.stdout


def test_a_folder_no_run_wrote_that_is_also_an_id_prefix_is_refused_naming_both(
    tmp_path: Path, db: str
) -> None:
    other = indexed(RunStore(db), eval_folder(tmp_path / "other", "x"), "d7aaaaaaaaaa")
    (tmp_path / "d7").mkdir()
    refused = runs_cli("runs", "show", "d7", db=db, cwd=tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "both the folder d7" in refused.stderr and f"run id {other}" in refused.stderr


@pytest.mark.parametrize("command", ["episodes", "doctor"])
def test_a_run_whose_folder_is_gone_is_said_to_be_gone(
    tmp_path: Path, db: str, command: str
) -> None:
    """It said the folder "holds no ... yet", as if the run had not written them yet."""
    store = RunStore(db)
    gone = indexed(store, eval_folder(tmp_path / "ev", "x"), "c0c0c0c0c0c0")
    (tmp_path / "ev" / "trajectories.jsonl").unlink()
    (tmp_path / "ev").rmdir()
    refused = runs_cli("runs", command, gone, db=db, cwd=tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert f"has no folder {tmp_path / 'ev'} any more (deleted or moved?)" in refused.stderr
    assert "yet" not in refused.stderr
    queued = store.create_run(
        kind="eval", name="q", config={}, source="serve", run_dir=tmp_path / "later",
        job={"kind": "eval", "config": {}},
    )  # fmt: skip
    waiting = runs_cli("runs", command, queued, db=db, cwd=tmp_path)
    assert waiting.returncode == 2 and "(queued) has not started" in waiting.stderr

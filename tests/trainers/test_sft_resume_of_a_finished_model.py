"""``agentgym sft --resume`` of an OUT that holds a finished model: nothing to do, exit 0.

A kill between the model's save and the removal of its checkpoint (``OUT.partial/``) left
both; a job queue, seeing the checkpoint, resumed the job, and the command's refusal ("holds a
finished model") turned a finished job into a ``failed`` one. The spent checkpoint goes now.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agentgym.runs._folder import SFT_SUMMARY, sft_checkpoint

AGENTGYM = Path(sys.executable).parent / "agentgym"


def test_resuming_a_finished_model_removes_its_spent_checkpoint_and_succeeds(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / SFT_SUMMARY).write_text("{}")
    (out / "model.safetensors").write_bytes(b"weights")
    checkpoint = sft_checkpoint(out)
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"state")
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "AGENTGYM_RUNS_DB": "off"}
    proc = subprocess.run(
        [str(AGENTGYM), "sft", "tiny", str(out), "--env", "calculator", "--resume"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "holds a finished model (sft.json): nothing to resume" in proc.stdout + proc.stderr
    assert not checkpoint.parent.exists()
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", SFT_SUMMARY]


def test_resuming_a_finished_model_with_other_settings_is_refused(tmp_path: Path) -> None:
    """``--resume --steps 2000`` of a finished 500-step model said "nothing to resume" and
    exited 0 with the old model; the settings it was trained with must be the ones given."""
    out = tmp_path / "out"
    out.mkdir()
    (out / SFT_SUMMARY).write_text(json.dumps({"config": {"steps": 500, "lr": 1e-4}}))
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "AGENTGYM_RUNS_DB": "off"}
    proc = subprocess.run(
        [str(AGENTGYM), "sft", "tiny", str(out), "--env", "calculator", "--resume",
         "--steps", "2000", "--lr", "1e-4"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said
    assert "holds a finished model of other settings: --steps (saved 500, now 2000)" in said
    assert "--lr" not in said.split("settings:")[1]  # the same lr is not named
    assert sorted(p.name for p in out.iterdir()) == [SFT_SUMMARY]  # nothing written

"""The runnable examples the README points to keep working."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_custom_env_example_registers_and_evaluates():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_env.py")],
        capture_output=True, text=True, timeout=120, check=True,
    )
    summary = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 4
    assert summary["status"]["ok"] == 4
    assert summary["reward/mean"] == 1.0

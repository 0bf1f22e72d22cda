"""An output folder under /proc: refused in one line before any work, not (sft) with
a traceback after the model loaded, nor (eval) as a folder that "cannot be made"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAYS = "/proc/foo is under /proc, the kernel's own file system, where no folder can be made"


@pytest.mark.parametrize("args", [["eval", "calculator", "-n", "1", "--out", "/proc/foo"],
                                  ["sft", "--env", "calculator", "--steps", "1", "tiny",
                                   "/proc/foo"],
                                  ["train", str(ROOT / "examples" / "quickstart.yaml"),
                                   "--dry-run", "--set", "output_dir=/proc/foo"]])  # fmt: skip
def test_an_output_under_proc_is_refused_in_one_line(args: list[str]) -> None:
    env = {**os.environ, "AGENTGYM_RUNS_DB": "off", "COLUMNS": "250"}
    script = Path(sys.executable).parent / "agentgym"
    done = subprocess.run([str(script), *args], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert done.returncode == 2
    assert SAYS in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_an_output_through_a_symlink_loop_is_one_line(tmp_path: Path) -> None:
    """The /proc check's `Path.resolve` raised RuntimeError on a loop (Python 3.11)."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    env = {**os.environ, "AGENTGYM_RUNS_DB": "off", "COLUMNS": "250"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "agentgym"), "eval", "calculator", "-n", "1",
         "--out", str(tmp_path / "loop" / "a" / "x")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.strip().endswith("choose another --out"), done.stderr

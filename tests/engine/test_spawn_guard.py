"""A script that starts vLLM without a ``__main__`` guard is told so in one line.

vLLM's engine process imports the main script again (spawn); a script starting an engine at
its top level fails there, and its parent saw only "Engine core initialization failed" after
screens of the child's traceback, reported as an infrastructure failure.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROBE = "from agentgym.engine._vllm import unguarded_script\nprint(unguarded_script())\n"


@pytest.mark.parametrize(
    ("body", "flagged"),
    [
        (PROBE, True),
        ("if __name__ == '__main__':\n" + "".join(f"    {line}\n" for line in PROBE.splitlines()),
         False),
    ],
)  # fmt: skip
def test_a_script_without_a_main_guard_is_named(tmp_path: Path, body: str, flagged: bool) -> None:
    script = tmp_path / "train_it.py"
    script.write_text(body)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         check=True).stdout.strip()  # fmt: skip
    assert out == (str(script) if flagged else "None")


def test_code_given_on_the_command_line_is_not_a_script() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True).stdout.strip()  # fmt: skip
    assert out == "None"

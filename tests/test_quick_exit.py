"""Processes that hold torch or vLLM exit without Python's last full garbage collection."""

from __future__ import annotations

import subprocess
import sys

#: A reference cycle that is garbage at exit, whose ``__del__`` says so when it is collected
#: (automatic collections are off, so only the one at shutdown can collect it).
CYCLE = """
import gc, sys
gc.disable()
class Loud:
    def __del__(self):
        sys.stdout.write("collected\\n")
a, b = Loud(), Loud()
a.other, b.other = b, a
del a, b
"""


def exit_output(prelude: str) -> str:
    done = subprocess.run([sys.executable, "-c", prelude + CYCLE], capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    return done.stdout


def test_exit_skips_the_final_collection_once_asked() -> None:
    assert "collected" in exit_output("")  # the control: Python's own shutdown collects it
    asked = "from agentgym._quick_exit import skip_final_collection\nskip_final_collection()\n"
    assert "collected" not in exit_output(asked)


def test_the_cli_and_every_vllm_process_agentgym_starts_ask_for_it() -> None:
    """`agentgym` commands, and vLLM's engine core and workers below an owner (the plugin)."""
    cli = "import sys\nsys.argv = ['agentgym', 'list']\nimport agentgym.cli\n" + CYCLE + (
        "agentgym.cli.main()\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", cli], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "collected" not in done.stdout and "Calculator" in done.stdout
    plugin = (
        "import os\nos.environ['AGENTGYM_ENGINE_OWNER'] = str(os.getppid())\n"
        "from agentgym.engine import _orphan_guard\n_orphan_guard.register()\n"
    )
    assert "collected" not in exit_output(plugin)

"""`quiet_backends`: vLLM's warnings reach the console, its known noise and INFO lines do not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

#: What an engine process does: agentgym's settings come through the environment it inherits.
SCRIPT = """
import os, sys
if sys.argv[1] == "parent":
    from agentgym.engine._quiet import quiet_backends
    quiet_backends()
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[2], "child", sys.argv[2]])
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging, init_logger
configure_logging(LoggingConfig())  # what vLLM's engine processes do as they start
log = init_logger("vllm.agentgym_test")
log.warning("Triton is not installed. Disabling Triton.")
log.warning("a warning that matters")
log.info("an info line")
"""
USERS_SETTINGS = ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "PYTHONWARNINGS")


def logged(tmp_path: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in USERS_SETTINGS}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, "parent", SCRIPT],
        env={**clean, "AGENTGYM_CACHE": str(tmp_path), "NO_COLOR": "1", **env},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.vllm
def test_a_spawned_engine_process_drops_known_noise_and_keeps_other_warnings(
    tmp_path: Path,
) -> None:
    require("vllm")
    out = logged(tmp_path)
    assert "a warning that matters" in out
    assert "WARNING" in out and "pid=" in out  # vLLM's own line format
    assert "Triton is not installed" not in out
    assert "an info line" not in out


@pytest.mark.vllm
def test_a_users_own_vllm_logging_level_wins(tmp_path: Path) -> None:
    require("vllm")
    out = logged(tmp_path, VLLM_LOGGING_LEVEL="INFO")
    assert "an info line" in out and "Triton is not installed" in out

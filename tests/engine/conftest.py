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

"""vLLM's processes end when the process that started them is killed with SIGKILL.

Before the guard, every ``kill -9`` of a training run left vLLM's engine core and worker alive
under init (2.5 GB on the CPU build), and on a GPU their memory would block the resume.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgym.engine import _orphan_guard
from tests.conftest import require

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]

OWNER = """
import sys, time
from agentgym.engine import VLLMPolicy

if __name__ == "__main__":
    policy = VLLMPolicy(sys.argv[1], max_model_len=256, sampling={"max_tokens": 4})
    policy.start()
    print("started", flush=True)
    time.sleep(600)
"""


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has already ended


def test_the_engine_ends_when_its_owner_is_killed(tmp_path: Path, tiny_model_dir: Path) -> None:
    require("vllm")
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen([sys.executable, str(script), str(tiny_model_dir)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert owner.stdout is not None
        lines = (line.strip() for line in owner.stdout)  # vLLM logs to stdout too
        assert "started" in lines, "the engine did not start"
        engine = descendants(owner.pid)
        assert engine, "vLLM started no process of its own"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 30 * _orphan_guard.POLL_SECONDS
    while any(alive(pid) for pid in engine) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling for an outcome, bounded: not a sleep standing in for sync
    left = [pid for pid in engine if alive(pid)]
    for pid in left:  # never leave them behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"vLLM processes outlived their owner: {left}"


def test_the_guard_leaves_processes_it_was_not_asked_to_watch(monkeypatch) -> None:
    monkeypatch.delenv(_orphan_guard.ENV_VAR, raising=False)
    monkeypatch.setattr(_orphan_guard, "_started", False)
    _orphan_guard.register()
    assert not _orphan_guard._started  # no owner set: nothing watched
    monkeypatch.setenv(_orphan_guard.ENV_VAR, str(os.getpid()))
    _orphan_guard.register()
    assert not _orphan_guard._started  # the owner itself is never watched

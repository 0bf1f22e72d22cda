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
    for _ in range(int(sys.argv[2])):  # a second engine's core forks from a forkserver
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


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has already ended


@pytest.mark.parametrize("engines", [1, 2])
def test_the_engine_ends_when_its_owner_is_killed(
    tmp_path: Path, tiny_model_dir: Path, engines: int
) -> None:
    """With two engines, the second's core is the child of a forkserver, also the owner's."""
    require("vllm")
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen([sys.executable, str(script), str(tiny_model_dir), str(engines)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert owner.stdout is not None
        lines = (line.strip() for line in owner.stdout)  # vLLM logs to stdout too
        assert "started" in lines, "the engine did not start"
        engine = descendants(owner.pid)
        assert len(engine) >= 2 * engines, "vLLM started no process of its own"  # core, worker
        servers = [pid for pid in engine if b"multiprocessing.forkserver" in cmdline(pid)]
        assert len(servers) == engines - 1, "the second engine's core was not the forkserver's"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert not still_alive(engine), "vLLM processes outlived their owner"


def still_alive(pids: set[int]) -> list[int]:
    """Those of ``pids`` alive after a bounded wait; they are killed (never left behind)."""
    deadline = time.monotonic() + 30 * _orphan_guard.POLL_SECONDS
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling for an outcome, bounded: not a sleep standing in for sync
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


GENERATING_OWNER = """
import asyncio, sys
from agentgym.engine import VLLMPolicy


async def generate(policy):
    while True:
        await policy.generate_ids([1, 2, 3], max_tokens=200)
        print("turn", flush=True)


if __name__ == "__main__":
    policy = VLLMPolicy(sys.argv[1], max_model_len=256,  # dtype "auto": float32 on the CPU
                        sampling={"max_tokens": 200, "extra": {"ignore_eos": True}})
    try:
        asyncio.run(generate(policy))
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        policy.close()
        print("closed", flush=True)
"""


def test_ctrl_c_at_a_terminal_stops_the_engine_through_its_owner(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A terminal's Ctrl-C reaches the whole process group: vLLM's worker died of it mid-step,
    and its engine core printed some 40 ERROR lines and a traceback ("Worker proc died
    unexpectedly") over the command's own "interrupted" line. The owner stops them now."""
    require("vllm")
    script = tmp_path / "owner.py"
    script.write_text(GENERATING_OWNER)
    owner = subprocess.Popen(
        [sys.executable, str(script), str(tiny_model_dir)], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's job
    )  # fmt: skip
    try:
        assert owner.stdout is not None
        said = []
        for line in owner.stdout:  # vLLM logs to stdout too
            said.append(line)
            if line.strip() == "turn":
                break
        assert said[-1].strip() == "turn", "the engine did not generate:\n" + "".join(said)
        engine = descendants(owner.pid)
        os.killpg(owner.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        said += owner.stdout.readlines()
        owner.wait(timeout=60)
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait()
    text = "".join(said)
    assert "stopped" in text and "closed" in text, text
    assert "Traceback" not in text and "ERROR" not in text, text
    assert not still_alive(engine)


def test_the_guard_leaves_processes_it_was_not_asked_to_watch(monkeypatch) -> None:
    monkeypatch.delenv(_orphan_guard.ENV_VAR, raising=False)
    monkeypatch.setattr(_orphan_guard, "_started", False)
    _orphan_guard.register()
    assert not _orphan_guard._started  # no owner set: nothing watched
    monkeypatch.setenv(_orphan_guard.ENV_VAR, str(os.getpid()))
    _orphan_guard.register()
    assert not _orphan_guard._started  # the owner itself is never watched

"""A LocalSandbox's folders outlive a process killed with -9 only until the next sandbox.

Why: the work dir (and a ``fresh_workdir`` call's own) was a plain ``mkdtemp`` removed by a
finalizer, which SIGKILL (or a SIGTERM with no handler) never runs: every killed run left
what its code wrote in the temp dir for good. Now each sandbox's folders sit in a folder
its process holds a lock on (`agentgym._owned_tmp`), and a new process's first LocalSandbox
removes those whose owner is dead, never a live process's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest

from agentgym import _owned_tmp
from agentgym.sandboxes import LocalSandbox
from agentgym.sandboxes._local import OWNED_PREFIX

SWEEPER = f"agentgym-sweep-{OWNED_PREFIX}"  # `_owned_tmp.sweep_once`'s thread

# argv: the FIFO a fresh_workdir call reports its work dir through, or "" for no such call.
CHILD = r"""
import sys, threading, warnings
warnings.simplefilter("ignore")
from agentgym.sandboxes import LocalSandbox
sb = LocalSandbox()
assert sb.run("open('written', 'w').write('x'); print(1)").stdout == "1\n"
fifo = sys.argv[1]
if fifo:
    code = ("import os, time\n"
            "parent = os.getppid()\n"
            f"with open({fifo!r}, 'w') as f: f.write(os.getcwd())\n"
            "while os.getppid() == parent: time.sleep(0.05)\n")  # ends once its owner dies
    threading.Thread(target=sb.run, args=(code,), kwargs={"fresh_workdir": True, "timeout": 60},
                     daemon=True).start()
print(sb.workdir, flush=True)
sys.stdin.read()  # lives until the test closes its stdin (or kills it)
"""


def _child(temp: Path, fifo: str) -> tuple[subprocess.Popen[str], Path]:
    """A process holding a LocalSandbox in ``temp``; its sandbox's work dir."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, fifo], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ,
                                                                    "TMPDIR": str(temp)})
    assert proc.stdout is not None
    workdir = Path(proc.stdout.readline().strip())
    assert workdir.is_dir() and temp in workdir.parents, workdir
    return proc, workdir


def _top(temp: Path, path: str | Path) -> Path:
    """The entry of ``temp`` that ``path`` lies in."""
    return temp / Path(path).relative_to(temp).parts[0]


def test_a_killed_processs_folders_are_swept_by_the_next_sandbox_a_live_ones_are_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    fifo = tmp_path / "ready.fifo"
    os.mkfifo(fifo)
    killed, killed_workdir = _child(temp, str(fifo))
    live, live_workdir = _child(temp, "")
    try:
        call_dir = Path(fifo.read_text())  # the fresh_workdir call runs in it now
        assert call_dir.is_dir() and temp in call_dir.parents
        killed.kill()
        assert killed.wait(timeout=30) == -signal.SIGKILL
        assert killed_workdir.is_dir() and (killed_workdir / "written").exists()  # no finalizer

        monkeypatch.setattr(tempfile, "tempdir", str(temp))  # this process's first sandbox there
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mine = LocalSandbox()
        try:
            assert not killed_workdir.exists() and not call_dir.exists()
            assert (live_workdir / "written").exists()  # another process's, alive: kept
            assert sorted(temp.iterdir()) == sorted([_top(temp, live_workdir),
                                                     _top(temp, mine.workdir)])
            assert mine.run("print(2)").stdout == "2\n"
        finally:
            mine.close()
        assert not _top(temp, mine.workdir).exists()
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                proc.communicate(timeout=30)  # EOF on stdin: it exits normally
    assert live.returncode == 0
    assert list(temp.iterdir()) == []  # the live one removed its own at exit


def test_the_first_sandbox_on_an_event_loop_sweeps_in_a_thread_not_holding_up_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Old: made on the loop (a `SandboxEnv` episode's setup, ``async with LocalSandbox()``),
    the first sandbox removed 3,000 leftover folders there, holding every task 1 to 3.5 s."""
    leftovers = 3000
    for i in range(leftovers):  # folders of killed runs: nobody holds their locks
        work = tmp_path / f"{OWNED_PREFIX}{100000 + i}-{_owned_tmp.HOST}-{i:08d}" / "work"
        work.mkdir(parents=True)
        (work / "out.txt").write_text("written by the killed run's code")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this process's first sweep there

    async def main() -> tuple[int, float]:
        stalls: list[float] = []

        async def ticker() -> None:  # the other tasks of the program: how long they waited
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.001)
                stalls.append(time.perf_counter() - last)
                last = time.perf_counter()

        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.01)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sandbox = LocalSandbox()
        left_then = len(os.listdir(tmp_path)) - 1  # without the new sandbox's own folder
        for sweeper in [t for t in threading.enumerate() if t.name == SWEEPER]:
            await asyncio.to_thread(sweeper.join, 60)
        ticking.cancel()
        assert os.listdir(tmp_path) == [_top(tmp_path, sandbox.workdir).name]  # all swept
        assert (await sandbox.arun("print(3)")).stdout == "3\n"
        sandbox.close()
        return left_then, max(stalls)

    left_then, longest_stall = asyncio.run(main())
    assert left_then > leftovers // 2, left_then  # old: 0, swept before the constructor returned
    assert longest_stall < 0.5, longest_stall

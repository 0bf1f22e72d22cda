"""A LocalSandbox's folders outlive a process killed with -9 only until the next sandbox.

Why: the work dir (and a ``fresh_workdir`` call's own) was a plain ``mkdtemp`` removed by a
finalizer, which SIGKILL (or a SIGTERM with no handler) never runs: every killed run left
what its code wrote in the temp dir for good. Now each sandbox's folders sit in a folder
its process holds a lock on (`agentgym._owned_tmp`), and a new process's first LocalSandbox
removes those whose owner is dead, never a live process's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from agentgym.sandboxes import LocalSandbox

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

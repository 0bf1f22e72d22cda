"""`agentgym._owned_tmp`: a folder lives while its owner does, and goes with the next start after.

Each test starts a real owner process and kills it with SIGKILL, as a user or a job queue
does: no exit hook runs, only the kernel drops the owner's lock.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agentgym import _owned_tmp

PREFIX = "agentgym-test-"
ROOT = Path(__file__).resolve().parents[1]

#: An owner: makes a folder, says where, forks a child that inherits the lock (as vLLM's
#: engine core does), says its pid, then waits for stdin to close.
OWNER = f"""
import os, sys
from agentgym import _owned_tmp
print(_owned_tmp.make_dir({PREFIX!r}), flush=True)
child = os.fork()
if child == 0:
    sys.stdin.read()
    os._exit(0)
print(child, flush=True)
sys.stdin.read()
"""


#: An owner on another machine sharing the temp dir (NFS): the same code, another machine tag.
OTHER_HOST_OWNER = f"from agentgym import _owned_tmp\n_owned_tmp.HOST = {'b' * 8!r}\n" + OWNER


def start_owner(temp: Path, code: str = OWNER) -> tuple[subprocess.Popen[str], Path, int]:
    """A live owner process, its folder in ``temp``, and the pid of its forked child."""
    process = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "TMPDIR": str(temp)},
    )  # fmt: skip
    assert process.stdout is not None
    folder, child = Path(process.stdout.readline().strip()), int(process.stdout.readline())
    return process, folder, child


def reap(pid: int) -> None:
    """SIGKILL ``pid`` (not our child) and wait until it is gone: its locks are dropped."""
    pidfd = os.pidfd_open(pid)  # first: by pid, init may reap it, and the pid be reused
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        select.select([pidfd], [], [], 30)  # readable once the process has ended
    finally:
        os.close(pidfd)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="os.pidfd_open: Linux")
def test_a_folder_stays_while_its_owner_or_a_fork_of_it_lives_and_goes_after(
    tmp_path: Path,
) -> None:
    process, folder, child = start_owner(tmp_path)
    try:
        assert folder.parent == tmp_path
        assert folder.name.startswith(f"{PREFIX}{process.pid}-{_owned_tmp.HOST}-")
        (folder / "server.log").write_text("in use")
        assert _owned_tmp.sweep(PREFIX, str(tmp_path)) == 0  # the owner lives
        process.kill()
        process.wait(timeout=30)
        assert _owned_tmp.sweep(PREFIX, str(tmp_path)) == 0  # its fork still uses it
        assert (folder / "server.log").read_text() == "in use"
    finally:
        process.kill()
        reap(child)
    assert _owned_tmp.sweep(PREFIX, str(tmp_path)) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="os.pidfd_open: Linux")
def test_a_sweep_leaves_the_folders_of_another_host_sharing_the_temp_dir(tmp_path: Path) -> None:
    """On NFS a lock taken on one host may not be seen on another: host B's live folder looked
    dead to host A's sweep, which deleted it. Here host B's owner is dead and its lock free, as
    A would see a live one; only B's own next sweep may take it."""
    process, folder, child = start_owner(tmp_path, OTHER_HOST_OWNER)
    process.kill()
    process.wait(timeout=30)
    reap(child)
    assert folder.name.startswith(f"{PREFIX}{process.pid}-bbbbbbbb-")
    assert _owned_tmp.sweep(PREFIX, str(tmp_path)) == 0
    assert folder.is_dir()


@pytest.mark.skipif(not os.path.exists("/proc/sys/kernel/random/boot_id"), reason="Linux")
def test_a_sweep_takes_a_dead_folder_of_another_host_name_on_this_kernel(tmp_path: Path) -> None:
    """Containers on one machine share its kernel, and so its locks, each with a host name of
    its own: tagged by host name, a container never swept another's dead folders."""
    another_name = "import socket\nsocket.gethostname = lambda: 'container-2'\n" + OWNER
    process, folder, child = start_owner(tmp_path, another_name)
    process.kill()
    process.wait(timeout=30)
    reap(child)
    assert _owned_tmp.sweep(PREFIX, str(tmp_path)) == 1
    assert not folder.exists()


def test_the_first_folder_of_a_kind_sweeps_the_dead_owners_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reused pid does not keep a folder: only the dead owner's lock counted. A folder named
    before the host tag is swept too: it names no host, and nothing else would remove it."""
    reused = tmp_path / f"{PREFIX}{os.getpid()}-{_owned_tmp.HOST}-abcd1234"  # nobody's lock
    untagged = tmp_path / f"{PREFIX}{os.getpid()}-abcd1234"  # named before the host tag
    other_kind = tmp_path / "agentgym-other-1-abcd1234"
    not_ours = tmp_path / f"{PREFIX}abcd1234"  # no owner in its name: another program's
    for folder in (reused, untagged, other_kind, not_ours):
        folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = _owned_tmp.make_dir(PREFIX)
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [mine.name, other_kind.name, not_ours.name]
        )
        reused.mkdir()  # a sweep is once per process and kind: later folders are not swept
        second = _owned_tmp.make_dir(PREFIX)
        assert reused.exists() and second.exists()
        _owned_tmp.remove(second)
        assert not second.exists()
    finally:
        _owned_tmp.remove(mine)


def test_a_kept_folder_is_out_of_every_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = _owned_tmp.make_dir(PREFIX)
    kept = _owned_tmp.keep(folder)
    assert kept.name == f"{PREFIX}{_owned_tmp.KEPT}{folder.name[len(PREFIX) :]}"
    assert _owned_tmp.sweep(PREFIX, str(tmp_path)) == 0  # unlocked, and still there
    assert [p.name for p in tmp_path.iterdir()] == [kept.name]


def test_a_folder_that_cannot_be_locked_keeps_its_hidden_name_out_of_every_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Published unlocked (no descriptor left, a file system without locks), another
    process's sweep could take it, and delete it, while its owner used it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_owned_tmp, "_lock", lambda path: None)
    folder = _owned_tmp.make_dir("agentgym-probe-")
    assert folder.name.startswith(".agentgym-probe-") and folder.is_dir()
    monkeypatch.undo()
    assert _owned_tmp.sweep("agentgym-probe-", str(tmp_path)) == 0 and folder.is_dir()
    _owned_tmp.remove(folder)


def sweep_of_a_000_folder(temp: str) -> int:
    """Sweep ``temp`` after a dead owner's code chmod'ed a folder in its folder 000; 0 if gone."""
    dead = Path(temp, f"{PREFIX}1-abcd1234")  # nobody holds its lock: its owner is dead
    locked_out = dead / "work" / "private"
    locked_out.mkdir(parents=True)
    (locked_out / "secret.txt").write_text("x")
    locked_out.chmod(0o000)
    removed = _owned_tmp.sweep(PREFIX, temp)
    return 0 if removed == 1 and not os.listdir(temp) else 1


def test_a_dead_owners_folder_holding_a_folder_chmodded_000_is_swept() -> None:
    """Code in a LocalSandbox may chmod a folder 000: a plain rmtree left it, every time.

    Root may enter any folder, so as root the sweep runs in a fork that is user nobody.
    """
    temp = tempfile.mkdtemp()
    try:
        if os.getuid() != 0:
            assert sweep_of_a_000_folder(temp) == 0
            return
        os.chown(temp, 65534, 65534)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                code = sweep_of_a_000_folder(temp)
            finally:
                os._exit(code)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    finally:
        _owned_tmp.remove_tree(temp)

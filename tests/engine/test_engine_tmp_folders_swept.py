"""The temp folders of the engine launchers: none stays after a clean exit or a stop, and the
ones of a process killed with SIGKILL go with the next start of their kind.

Before: every `serve_vllm` left a ``vllm_dist_*`` file in /tmp (its engine, stopped with
SIGTERM, kept its torch.distributed file store), a stop (Ctrl-C, or SIGTERM through the CLI)
kept the server logs as an error would, and a killed process left its server log and socket
folders for good: 77 ``agentgym-vllm-*``, 16 ``agentgym-router-*`` and 21 ``agentgym-rpc-*``
on the machine this was found on. No vLLM here: a stand-in command takes the server's place.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agentgym import _owned_tmp
from agentgym.engine import _rpc_dir, _serve

ROOT = Path(__file__).resolve().parents[2]

#: A stand-in server: says so in its log and exits.
SERVER = [sys.executable, "-c", "print('served')"]

#: A vLLM process below ours, as vLLM starts it: its plugin hook, then its temp dir and
#: torch's compile cache.
ENGINE = ("import os, tempfile; from agentgym.engine import _rpc_dir; _rpc_dir.register(); "
          "print(tempfile.gettempdir(), os.environ['TORCHINDUCTOR_CACHE_DIR'])")  # fmt: skip

#: A process that starts a server and makes its socket folder, says where, and waits.
KILLED_OWNER = f"""
import os
from agentgym.engine import _rpc_dir, _serve
process, log = _serve._spawn({SERVER!r}, dict(os.environ), "agentgym-vllm-")
process.wait()
_rpc_dir.use_private_dir()
print(log.parent, os.environ[_rpc_dir.ENV_VAR], flush=True)
input()
"""


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp dir of the test's own, for this process and the ones it starts.

    The socket folder this process made for an earlier engine is forgotten too: otherwise
    `use_private_dir` hands out that real folder, and a test that removes it pulls the live
    one from under that engine.
    """
    monkeypatch.setattr(_rpc_dir, "_folder", None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv(_rpc_dir.ENV_VAR, raising=False)
    return tmp_path


def spawn() -> Path:
    """Start the stand-in server; its log, once it has exited."""
    process, log = _serve._spawn(SERVER, dict(os.environ), "agentgym-vllm-")
    process.wait(timeout=60)
    return log


def test_the_folders_of_a_killed_process_go_with_the_next_start_of_their_kind(
    temp: Path,
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", KILLED_OWNER], cwd=ROOT, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert owner.stdout is not None
        log_folder, rpc_folder = map(Path, owner.stdout.readline().split())
    finally:
        owner.kill()
        owner.wait(timeout=30)
    assert log_folder.is_dir() and rpc_folder.is_dir()  # no exit hook ran
    log = spawn()
    env: dict[str, str] = {}
    _rpc_dir.use_private_dir(env)
    assert (log_folder.exists(), rpc_folder.exists()) == (False, False)
    assert sorted(temp.iterdir()) == sorted([log.parent, Path(env[_rpc_dir.ENV_VAR])])
    for folder in temp.iterdir():
        _owned_tmp.remove(folder)


def test_the_engine_processes_keep_their_temp_files_in_the_socket_folder(
    temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's engine core makes its ``vllm_dist_*`` file store in its temp dir and left it
    there when killed; torch's compile cache stays where it was, or each start would compile
    afresh. The process that made the folder keeps its temp dir (vLLM loads plugins there too).
    """
    env = dict(os.environ)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # set by torch once it compiled in this process
    env.pop(_rpc_dir.TEMP_VAR, None)
    _rpc_dir.use_private_dir(env)
    folder = env[_rpc_dir.ENV_VAR]
    engine = subprocess.run([sys.executable, "-c", ENGINE], env=env, capture_output=True,
                            text=True, check=True, timeout=60)  # fmt: skip
    compile_cache = temp / f"torchinductor_{getpass.getuser()}"
    assert engine.stdout.split() == [folder, str(compile_cache)]
    monkeypatch.setenv(_rpc_dir.TEMP_VAR, env[_rpc_dir.TEMP_VAR])
    _rpc_dir.register()
    assert tempfile.gettempdir() == str(temp)
    _owned_tmp.remove(Path(folder))


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_stop_is_no_failure_the_logs_go(temp: Path, stop: type[BaseException]) -> None:
    """Ctrl-C, the CLI's SIGTERM (a Ctrl-C to the code) and `sys.exit` kept the logs."""
    log = spawn()
    with pytest.raises(stop), _serve._logs_kept_only_on_error([log]):
        raise stop()
    assert list(temp.iterdir()) == []


def test_a_log_kept_after_a_failure_is_out_of_the_next_sweep(
    temp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The user was told to read it: the next start must not remove it first."""
    log = spawn()
    with pytest.raises(RuntimeError), _serve._logs_kept_only_on_error([log]):
        raise RuntimeError("the block failed")
    [kept] = temp.iterdir()
    assert kept.name.startswith("agentgym-vllm-kept-")  # renamed out of every later sweep
    assert f"server logs kept: {kept / 'server.log'}" in caplog.text
    assert _owned_tmp.sweep("agentgym-vllm-", str(temp)) == 0
    assert (kept / "server.log").exists()


def test_a_process_gives_every_engine_and_server_one_socket_folder(temp: Path) -> None:
    """A folder (and its open lock) per server start piled up in a process starting many."""
    first, second = {}, {}
    _rpc_dir.use_private_dir(first)
    _rpc_dir.use_private_dir(second)
    assert first[_rpc_dir.ENV_VAR] == second[_rpc_dir.ENV_VAR]
    assert Path(first[_rpc_dir.ENV_VAR]).is_dir()


def test_a_child_process_drops_the_engine_temp_dir_it_inherited() -> None:
    """A child of a process that started an engine inherits both variables; keeping the
    parent's `TEMP_VAR` made the parent's folder (deleted at its exit) the child's engines'
    temp dir. The process's own entry stays."""
    parent = {_rpc_dir.ENV_VAR: "/tmp/rpc-1", _rpc_dir.TEMP_VAR: "1:/tmp/rpc-1"}
    _rpc_dir.use_private_dir(parent)
    assert parent == {_rpc_dir.ENV_VAR: "/tmp/rpc-1"}
    own = {_rpc_dir.ENV_VAR: "/f", _rpc_dir.TEMP_VAR: f"{os.getpid()}:/f"}
    _rpc_dir.use_private_dir(own)
    assert own == {_rpc_dir.ENV_VAR: "/f", _rpc_dir.TEMP_VAR: f"{os.getpid()}:/f"}

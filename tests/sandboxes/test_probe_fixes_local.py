"""LocalSandbox fixes from the probe: the cancel window, results not exceptions, the work dir."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import warnings

import pytest

from agentgym._errors import ConfigError
from agentgym.sandboxes import DockerSandbox, LocalSandbox, LocalSandboxConfig, _protocol


def _local() -> LocalSandbox:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LocalSandbox()


@pytest.fixture
def local():
    sb = _local()
    yield sb
    sb.close()


class _CancelledWhileSpawning(LocalSandbox):
    """Cancels its own ``arun`` while ``exec`` builds the process: after the call registered
    its kill, before the pid exists (the window the probe hit in its first ~3 ms)."""

    task: asyncio.Task[object]
    loop: asyncio.AbstractEventLoop

    def _env(self, workdir: str) -> dict[str, str]:
        token = _protocol._current.token
        self.loop.call_soon_threadsafe(self.task.cancel)
        deadline = time.monotonic() + 10
        while not token.cancelled:  # the cancel has reached the call (and found no pid)
            assert time.monotonic() < deadline, "the cancel never reached the call"
            time.sleep(0.001)
        return super()._env(workdir)


async def test_cancel_before_the_pid_is_known_kills_the_code():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = _CancelledWhileSpawning()
    try:
        sb.loop = asyncio.get_running_loop()
        sb.task = asyncio.ensure_future(sb.arun("import time; time.sleep(30)", timeout=30))
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await sb.task
        assert time.monotonic() - started < 10, "the cancelled code ran on to its timeout"
    finally:
        sb.close()


def test_a_missing_command_is_the_calls_error(local):
    r = local.exec(["no-such-cmd-agentgym"])
    assert (r.status.value, r.exit_code) == ("error", 127)
    assert r.stderr == "no-such-cmd-agentgym: No such file or directory\n"


def test_a_nul_byte_in_argv_is_the_calls_error(local):
    r = local.exec(["echo", "a\x00b"])
    assert r.status.value == "error" and "null byte" in r.stderr and r.infra_error is None


def test_argv_items_that_are_not_strings_run_as_their_str_as_in_docker(local):
    """``exec(["echo", 3])`` raised a bare TypeError locally; DockerSandbox runs ``str(3)``."""
    from pathlib import Path

    r = local.exec(["echo", 3, Path("a/b")])
    assert (r.status.value, r.stdout) == ("ok", "3 a/b\n")


def test_a_file_that_cannot_be_written_is_the_calls_error(local):
    r = local.run("print(1)", files={"x" * 300: ""})
    assert r.status.value == "error" and r.stderr.startswith("sandbox: cannot write 'xxx")
    assert "File name too long" in r.stderr
    assert local.run("print(1)").stdout == "1\n"  # the sandbox goes on


@pytest.mark.parametrize("call, message", [
    (lambda sb: sb.run("print(1)", stdin="\udcff"), "stdin is not valid Unicode text"),
    (lambda sb: sb.run("print(1)", files={"f": "\udcff"}), "files['f'] is not valid Unicode"),
])
@pytest.mark.parametrize("backend", ["local", "docker"])
def test_a_callers_mistake_is_a_one_line_config_error(call, message, backend):
    # DockerSandbox checks before its container starts: no daemon is reached here.
    sb = _local() if backend == "local" else DockerSandbox()
    try:
        with pytest.raises(ConfigError) as info:
            call(sb)
        assert str(info.value).startswith(message) and "\n" not in str(info.value)
    finally:
        sb.close()


def test_a_dropped_sandbox_deletes_its_work_dir():
    sb = _local()
    workdir = sb.workdir
    sb.run("open('big.bin', 'wb').write(b'0' * 1000)")
    del sb  # the finalizer must not keep the sandbox alive
    assert not os.path.exists(workdir)


def test_a_sandbox_never_closed_deletes_its_work_dir_at_exit():
    script = ("import warnings; warnings.simplefilter('ignore')\n"
              "from agentgym.sandboxes import LocalSandbox\n"
              "sb = LocalSandbox()\n"  # a module global: alive until the interpreter exits
              "sb.run(\"open('f', 'w').write('x')\")\n"
              "print(sb.workdir)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=os.getcwd(), check=True)
    workdir = done.stdout.strip()
    assert "agentgym-local-" in workdir and not os.path.exists(workdir)


@pytest.mark.parametrize("limits", [{"nofile": 10**8}, {"mem_limit_mb": 2**60}])
def test_a_limit_the_machine_refuses_is_named_not_a_bare_subprocess_error(limits) -> None:
    """Over the hard limit (or past what setrlimit takes), the child's setrlimit raised and
    Popen said only "Exception occurred in preexec_fn." (a `SubprocessError`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = LocalSandbox(LocalSandboxConfig(**limits))
    try:
        with pytest.raises(ConfigError, match=r"cannot set its limits \(mem_limit_mb=.*nproc="
                           r"None\): one is over this machine's hard limit .*LocalSandboxConfig"):
            sb.run("print(1)")
        assert os.listdir(sb.workdir) == []
    finally:
        sb.close()

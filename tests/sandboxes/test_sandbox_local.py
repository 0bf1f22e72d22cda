"""LocalSandbox: a subprocess with rlimits (no Docker needed)."""

from __future__ import annotations

import os
import threading
import warnings

import pytest

from agentgym.sandboxes import LocalSandbox, LocalSandboxConfig, verify
from tests.sandboxes.conftest import BLOCKING_CELL


@pytest.fixture
def local():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sb = LocalSandbox(LocalSandboxConfig(output_limit_bytes=10_000))
    yield sb
    sb.close()


def test_runs_code_with_stdin_and_files(local):
    r = local.run("import sys; print(open('f.txt').read(), sys.stdin.read())",
                  stdin="in", files={"f.txt": "file"})
    assert (r.status.value, r.stdout) == ("ok", "file in\n")


def test_env_is_scrubbed(local, monkeypatch):
    monkeypatch.setenv("AGENTGYM_SECRET", "s3cret")
    r = local.run("import os; print(os.environ.get('AGENTGYM_SECRET'))")
    assert r.stdout == "None\n"


def test_timeout_kills_group(local):
    r = local.run("import time; time.sleep(30)", timeout=0.5)
    assert r.status.value == "timeout" and r.duration < 5


def test_output_limit(local):
    r = local.run("while True: print('x' * 1000)")
    assert r.status.value == "output_limit" and r.truncated
    assert len(r.stdout) + len(r.stderr) <= 10_000


def test_memory_limit(local):
    r = local.run("x = bytearray(4 * 1024 ** 3)")
    assert r.status.value == "oom"


def test_file_escape_rejected(local):
    from agentgym._errors import ConfigError

    with pytest.raises(ConfigError, match="leaves the work directory"):
        local.run("pass", files={"../x": "no"})


def test_verify_works_locally(local):
    res = verify("def f(x):\n    return x + 1\n", ["assert f(1) == 2", "assert f(1) == 3"],
                 sandbox=local)
    assert res.reward == 0.5 and [t.passed for t in res.tests] == [True, False]


def test_interrupt_kills_the_running_call(local):
    fifo = os.path.join(local.workdir, "ready")
    os.mkfifo(fifo)
    results = []
    call = threading.Thread(target=lambda: results.append(local.run(BLOCKING_CELL, timeout=60)))
    call.start()
    with open(fifo) as fh:  # returns once the code has opened the FIFO: it is running
        pid = int(fh.read())
    local.interrupt()
    call.join()
    assert (results[0].status.value, results[0].exit_code) == ("error", -9)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

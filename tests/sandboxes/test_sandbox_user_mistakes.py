"""Round 38 of user testing the sandboxes: what an engineer reusing them to verify rewards hit.

- A lease kept past its end (a tool's watchdog, a helper holding ``sb``) could still reach
  the sandbox, which by then belongs to the next episode: ``interrupt()`` killed that
  episode's running code (scored as its ``error``), ``snapshot()`` read its files and
  ``restore()`` overwrote them.
- ``verify`` in ``assert`` mode took tests that are not strings (every sample then failed
  as the candidate's fault) and blank tests (which assert nothing, so every candidate passed).
- Caller mistakes that came back as the sandbox's or the code's outcome: nan/inf timeouts
  (infra_error), code that is not a str, a dict as config, limits too small for the harness
  (every sample failed, reward 0); a fresh call that could not start said nothing.
- A sandbox dropped without close() kept its container past the process's exit; the CLI's
  `bench --n 0` crashed after starting a pool, `build --if-missing` with no daemon started
  a build.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import threading
import warnings

import pytest

from agentgym._errors import ConfigError, SandboxError
from agentgym.sandboxes import (
    DockerSandbox,
    DockerSandboxConfig,
    LocalSandbox,
    SandboxPool,
    SandboxToolEnv,
    _reap,
    verify,
)
from tests.sandboxes.conftest import BLOCKING_CELL, MAKE_FIFO, wait_until_code_runs

pytestmark = pytest.mark.docker


@pytest.fixture
def one_pool(docker_ready):
    """A pool of one sandbox, so the next lease gets the container the last one had."""
    with SandboxPool(size=1) as p:
        yield p


def test_interrupt_through_an_ended_lease_does_not_kill_the_next_episodes_code(one_pool):
    with one_pool.lease() as stale:
        assert stale.run("print(1)").stdout == "1\n"
    with one_pool.lease() as current:
        assert current.container_id == stale.container_id
        current.run(MAKE_FIFO)
        out = {}
        cell = BLOCKING_CELL.replace("time.sleep(60)", "time.sleep(1)\nprint('finished')")
        th = threading.Thread(target=lambda: out.setdefault("r", current.run(cell)))
        th.start()
        wait_until_code_runs(current)
        stale.interrupt()  # the old episode's handle: must not reach this episode's code
        th.join()
    r = out["r"]
    assert (r.status.value, r.stdout) == ("ok", "finished\n"), r


def test_snapshot_and_restore_through_an_ended_lease_are_refused(one_pool):
    with one_pool.lease() as stale:
        snap = stale.snapshot()  # while it lasts: allowed
    with one_pool.lease() as current:
        current.run("open('answer.txt', 'w').write('the next episode')")
        with pytest.raises(SandboxError, match="lease has ended"):
            stale.snapshot()
        with pytest.raises(SandboxError, match="lease has ended"):
            stale.restore(snap)
        names = tarfile.open(fileobj=io.BytesIO(current.snapshot().tar)).getnames()
        assert names == ["answer.txt"]


@pytest.fixture
def local():
    """Nothing runs: the arguments are refused before the call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "NOT a security boundary", once
        sb = LocalSandbox()
    yield sb
    sb.close()


@pytest.mark.parametrize("tests, match", [
    (["assert f() == 1", ""], "assert test 1 is empty"),
    (["   \n"], "assert test 0 is empty"),
    ([1], "assert test 0 is int, not str"),
    (["assert f() == 1", None], "assert test 1 is NoneType, not str"),
    (None, "assert mode takes a list of test snippets"),
])
def test_assert_tests_that_are_blank_or_not_strings_are_refused(local, tests, match):
    with pytest.raises(ConfigError, match=match):
        verify("def f():\n    return 2\n", tests, sandbox=local)


def test_pytest_parts_that_are_not_strings_are_refused(local):
    with pytest.raises(ConfigError, match="pytest test 1 is bytes, not str"):
        verify("def f():\n    return 2\n", ["def test_a():\n    pass", b"x"], mode="pytest",
               sandbox=local)


def test_bench_with_no_runs_is_a_config_error_before_any_container():
    from typer.testing import CliRunner

    from agentgym.sandboxes._cli import app

    # Before: a pool was started, then statistics.median([]) raised StatisticsError.
    result = CliRunner().invoke(app, ["bench", "--n", "0", "--no-humaneval", "--pool-size", "1"])
    assert isinstance(result.exception, ConfigError), result.exception
    assert "n (--n)" in str(result.exception)


def test_build_if_missing_with_the_daemon_down_says_so_instead_of_building(monkeypatch):
    from typer.testing import CliRunner

    from agentgym.sandboxes._cli import app

    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")  # nothing listens there
    result = CliRunner().invoke(app, ["build", "--if-missing"])
    # Before: any failure of the check meant "build it": "registry unreachable: building
    # with debootstrap" (a root-only build of a Debian tree) before the daemon's error.
    assert isinstance(result.exception, SandboxError), (result.exception, result.output)
    assert "cannot reach the Docker daemon" in str(result.exception)
    assert "debootstrap" not in result.output


FORKS_UNTIL_NO_PID = (
    "import os, time\n"
    "for i in range(500):\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(60)\n"
    "            os._exit(0)\n"
    "    except OSError:\n"
    "        print('no pid after', i)\n"
    "        break\n")


def test_a_fresh_call_that_cannot_start_says_why(one_pool):
    with one_pool.lease() as sb:
        cell = sb.run(FORKS_UNTIL_NO_PID, session=True, timeout=20)
        assert cell.ok and "no pid after" in cell.stdout, cell
        # The cell's children are killed after it, but stay zombies of the session kernel
        # and hold the pids: a fresh call then may not start. Before, it was an `error`
        # with nothing on stderr.
        r = sb.run("print('fresh')", session=False, timeout=20)
        if r.ok:  # the server's own fork found no room and ended the session (documented)
            assert r.stdout == "fresh\n" and "session was ended" in r.stderr, r
        else:
            assert r.status.value == "error", r
            assert "could not start" in r.stderr and "reset()" in r.stderr, r
            sb.reset()
            assert sb.run("print('fresh')", session=False).stdout == "fresh\n"


def test_an_argv_with_a_nul_byte_says_why_on_both_backends(one_pool, local):
    """The code server's exec raised ValueError, not OSError, after its stderr was the
    call's: an `error` with nothing on stderr in Docker, where LocalSandbox said why."""
    with one_pool.lease() as sb:
        in_docker = sb.exec(["echo", "a\x00b"])
        assert sb.exec(["echo", "next"]).stdout == "next\n"  # the server is fine
    here = local.exec(["echo", "a\x00b"])
    for result in (in_docker, here):
        assert result.status.value == "error", result
        assert result.stderr == "sandbox: cannot run 'echo': embedded null byte\n", result


@pytest.mark.parametrize("kwargs, match", [
    ({"per_test_timeout": float("nan")}, "per_test_timeout must be a number"),  # was: failed
    ({"total_timeout": float("nan")}, "total_timeout must be a number"),  # was: infra_error
    ({"total_timeout": float("inf")}, "total_timeout must be a number"),  # was: infra_error
    ({"per_test_timeout": "5"}, "per_test_timeout must be a number"),  # was: TypeError
])
def test_verify_refuses_timeouts_that_are_not_finite_positive_numbers(local, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        verify("def f():\n    return 1\n", ["assert f() == 1"], sandbox=local, **kwargs)


@pytest.mark.parametrize("code", [None, b"def f():\n    return 1\n"])
def test_verify_refuses_code_that_is_not_a_string(local, code):
    # Before: None failed every test as the candidate's doing; bytes raised a JSON TypeError.
    with pytest.raises(ConfigError, match="code must be a str"):
        verify(code, ["assert f() == 1"], sandbox=local)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1])
def test_run_refuses_a_bad_timeout_instead_of_an_infra_error(one_pool, timeout):
    # Before: nan and inf came back as infra_error (and recycled the sandbox), -1 as timeout.
    with one_pool.lease() as sb:
        with pytest.raises(ConfigError, match="timeout must be a number of seconds"):
            sb.run("print(1)", timeout=timeout)
        assert sb.run("print(1)", timeout=5).stdout == "1\n"
        assert not sb.needs_recycle


def test_a_sandbox_dropped_without_close_is_removed_at_exit(docker_client):
    # Docs: "This process's own sandboxes are removed at close() and at interpreter exit".
    # The atexit hook held them weakly, so a sandbox nobody referenced any more (a one-shot
    # `DockerSandbox().run(...)`) was forgotten and its container outlived the process.
    script = ("import gc, os\nfrom agentgym.sandboxes import DockerSandbox\n"
              "print(os.getpid(), DockerSandbox().run('print(7)').stdout.strip())\n"
              "gc.collect()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    pid, printed = done.stdout.split()
    assert printed == "7"
    left = docker_client.containers.list(all=True, filters={"label": f"{_reap.OWNER}={pid}"})
    for c in left:  # clean up before failing: the test must not leak what it checks
        c.remove(force=True)
    assert not left, [c.short_id for c in left]


@pytest.mark.parametrize("make", [
    lambda knobs: SandboxPool(size=1, config=knobs).config,
    lambda knobs: SandboxToolEnv([], tasks=[{"prompt": "x"}], sandbox_config=knobs).sandbox_config,
    lambda knobs: DockerSandbox(config=knobs).config,
])
def test_a_mapping_of_knobs_is_a_config_and_a_wrong_one_is_refused_up_front(make):
    # Before: a mapping (what YAML gives a training config's env_kwargs) was taken as it was,
    # then the first container failed with "'dict' object has no attribute 'loosened'".
    assert make({"mem_limit_mb": 256}) == DockerSandboxConfig(mem_limit_mb=256)
    with pytest.raises(ConfigError, match=r"unknown knob\(s\) mem_limit; DockerSandboxConfig has"):
        make({"mem_limit": 256})
    with pytest.raises(ConfigError, match="mem_limit_mb must be >= 64"):
        make({"mem_limit_mb": 8})


@pytest.mark.parametrize("knobs, match", [
    ({"mem_limit_mb": 32}, "mem_limit_mb must be >= 64, got 32"),
    ({"pids_limit": 6}, "pids_limit must be >= 16, got 6"),
])
def test_limits_too_small_for_the_harness_are_refused(knobs, match):
    # Before: accepted, and every sample failed as the candidate's doing (reward 0, not
    # infra_error): at 32 MiB pytest mode's runner was OOM-killed, at 6 pids verify could
    # not start its judge ("the test runner reported nothing readable").
    with pytest.raises(ConfigError, match=match):
        DockerSandboxConfig(**knobs)


def test_the_smallest_limits_allowed_still_verify(docker_ready):
    cfg = DockerSandboxConfig(mem_limit_mb=64, pids_limit=16)
    module = "from solution import f\ndef test_a():\n    assert f() == 1"
    with DockerSandbox(config=cfg) as sb:
        for mode, tests in (("assert", ["assert f() == 1"]), ("pytest", module)):
            res = verify("def f():\n    return 1\n", tests, mode=mode, sandbox=sb)
            assert res.status == "passed", (mode, res)

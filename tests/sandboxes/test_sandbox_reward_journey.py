"""An ML engineer verifying rewards with the sandboxes (README section 4, docs/sandboxes.md).

What that journey hit, each checked here against the real daemon:

- Cancelling ``averify``/``arun`` on a bare `DockerSandbox` or `LocalSandbox` left the code
  running to its own timeout: the sandbox's next call waited for it, ``asyncio.run`` hung at
  exit, and Ctrl-C of such a script took the whole timeout to come back.
- ``interrupt()`` with no call running killed the idle code server: the next call, which ran
  nothing wrong, came back as the code's ``error`` (a correct candidate could score 0).
- ``close()`` of a pool (or a sandbox) while a verification ran waited for its whole timeout;
  a `DockerSandbox` used after ``close()`` silently started a new container, and a
  `LocalSandbox` raised a bare ``FileNotFoundError``.
- ``pool.lease(timeout="5")`` raised a bare ``TypeError`` and left its waiter queued: the
  next sandbox returned went to it and was lost, so the pool's next lease hung.
- Caller mistakes that were scored as the sandbox's or raised bare: code that is not text
  (``infra_error``), an argv given as one string (ran its first letter), config numbers that
  are nan, inf or strings, a stdio case that no program can read or print (every candidate
  failed it, reward 0).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

from agentgym._errors import ConfigError, SandboxError
from agentgym.sandboxes import (
    DockerSandbox,
    DockerSandboxConfig,
    LocalSandbox,
    LocalSandboxConfig,
    SandboxPool,
    SandboxToolEnv,
    averify,
    verify,
)
from tests.sandboxes.conftest import own_containers, read_handshake, wait_until_code_runs

pytestmark = pytest.mark.docker

# A candidate that says it started (the FIFO handshake of conftest) and then runs a minute.
# It makes the FIFO itself: verify empties the work dir before the candidate runs.
BLOCKING_CANDIDATE = ("import os, time\nos.mkfifo('/work/ready')\n"
                      "with open('/work/ready', 'w') as fh:\n"
                      "    fh.write(str(os.getpid()))\ntime.sleep(60)\ndef f():\n    return 1\n")
LONG = {"per_test_timeout": 60.0, "total_timeout": 60.0}


@pytest.fixture
def docker_sb(docker_ready):
    with DockerSandbox() as sb:
        yield sb


@pytest.fixture
def local_sb():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "not a security boundary": known
        sb = LocalSandbox()
    yield sb
    sb.close()


# -- cancellation ---------------------------------------------------------------------------
async def test_cancelling_averify_on_a_bare_docker_sandbox_kills_its_code(docker_sb):
    task = asyncio.create_task(averify(BLOCKING_CANDIDATE, ["assert f() == 1"],
                                       sandbox=docker_sb, **LONG))
    await asyncio.to_thread(wait_until_code_runs, docker_sb)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 15)
    # the cancelled call's code is gone: the next call does not wait a minute behind it
    nxt = await asyncio.wait_for(docker_sb.arun("print(1)"), 15)
    assert nxt.ok and nxt.stdout == "1\n", nxt


async def test_cancelling_averify_on_a_local_sandbox_kills_its_code(local_sb, tmp_path):
    fifo = tmp_path / "ready"
    os.mkfifo(fifo)
    code = (f"import os, time\nwith open({str(fifo)!r}, 'w') as fh:\n"
            "    fh.write(str(os.getpid()))\ntime.sleep(60)\ndef f():\n    return 1\n")
    task = asyncio.create_task(averify(code, ["assert f() == 1"], sandbox=local_sb, **LONG))
    pid = int(await asyncio.to_thread(fifo.read_text))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 15)
    # killed with its runner (its parent's death signal follows within moments), not left to
    # sleep out its minute
    deadline = time.monotonic() + 5
    while _pid_runs(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not _pid_runs(pid), f"the cancelled candidate {pid} still runs"


def _pid_runs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except OSError:
        return False


CTRL_C_SCRIPT = textwrap.dedent("""
    import asyncio, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from agentgym.sandboxes import DockerSandbox, averify
    CODE = sys.argv[1]

    async def main():
        async with DockerSandbox() as sb:
            await sb.arun("print(0)")  # the container runs
            print(sb.container_id, flush=True)
            await averify(CODE, ["assert f() == 1"], sandbox=sb, per_test_timeout=60,
                          total_timeout=60)

    asyncio.run(main())
""")


def test_ctrl_c_of_an_async_verify_script_returns_at_once_and_leaves_no_container(
        docker_client):
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT, BLOCKING_CANDIDATE],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        cid = proc.stdout.readline().strip()
        assert cid, proc.stderr.read() if proc.stderr else ""
        container = docker_client.containers.get(cid)
        read_handshake(container, "1000:1000", "/work")  # the candidate runs now
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)  # before: the verify's whole minute
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert cid not in {c.id for c in docker_client.containers.list(all=True)}


# -- interrupt and close --------------------------------------------------------------------
def test_interrupt_with_no_call_running_leaves_the_next_call_alone(docker_sb):
    assert docker_sb.run("print(0)").ok
    docker_sb.interrupt()
    r = docker_sb.run("print(1)")
    assert r.ok and r.stdout == "1\n", r
    res = verify("def f():\n    return 1\n", ["assert f() == 1"], sandbox=docker_sb)
    assert res.passed, res


def test_closing_a_pool_kills_the_verification_running_in_it_as_infra_error(docker_client):
    pool = SandboxPool(size=1).start()
    got: dict[str, object] = {}
    leased = threading.Event()

    def episode() -> None:
        with pool.lease(timeout=30) as sb:
            got["sb"] = sb
            leased.set()
            try:
                got["result"] = verify(BLOCKING_CANDIDATE, ["assert f() == 1"], sandbox=sb,
                                       **LONG)
            except SandboxError as exc:  # also fine: nothing was scored
                got["result"] = exc

    worker = threading.Thread(target=episode)
    worker.start()
    try:
        assert leased.wait(30)
        cid = got["sb"].container_id
        wait_until_code_runs(got["sb"])
        started = time.monotonic()
        pool.close()
        closed_in = time.monotonic() - started
        worker.join(15)
        assert not worker.is_alive(), "the verification still runs after the pool closed"
    finally:
        pool.close()
        worker.join()
    assert closed_in < 15, closed_in  # before: the verification's whole minute
    result = got["result"]
    if not isinstance(result, SandboxError):  # never a verdict of the candidate's code
        assert result.status == "infra_error" and result.reward is None, result
    assert cid not in {c.id for c in own_containers()}


def test_a_closed_docker_sandbox_refuses_calls_instead_of_starting_a_container(docker_ready):
    sb = DockerSandbox().start()
    sb.close()
    with pytest.raises(SandboxError, match="closed"):
        sb.run("print(1)")
    with pytest.raises(SandboxError, match="closed"):
        verify("x = 1", ["assert x == 1"], sandbox=sb)
    assert sb.container_id is None  # no new container behind the caller's back
    sb.close()


def test_a_lease_kept_past_its_pools_close_starts_no_container(docker_ready):
    pool = SandboxPool(size=1).start()
    try:
        with pool.lease(timeout=30) as sb:
            pool.close()
            with pytest.raises(SandboxError):
                sb.run("print(1)")
            assert sb.container_id is None
    finally:
        pool.close()


def test_a_closed_local_sandbox_says_so(local_sb):
    local_sb.close()
    with pytest.raises(SandboxError, match="closed"):
        local_sb.run("print(1)")
    with pytest.raises(SandboxError, match="closed"):
        verify("x = 1", ["assert x == 1"], sandbox=local_sb)


# -- a pool's lease timeout -----------------------------------------------------------------
@pytest.mark.parametrize("bad", ["5", math.nan, -1, math.inf, True])
def test_a_bad_lease_timeout_is_refused_and_loses_no_sandbox(docker_ready, bad):
    with SandboxPool(size=1) as pool:
        with pool.lease(timeout=30):  # the only sandbox is out: a lease now has to wait
            with pytest.raises(ConfigError, match="lease timeout"):
                with pool.lease(timeout=bad):
                    pass
        with pool.lease(timeout=30) as sb:  # before: handed to the dead waiter, lost
            assert sb.run("print(1)").stdout == "1\n"


async def test_a_bad_async_lease_timeout_is_refused(docker_ready):
    async with SandboxPool(size=1) as pool:
        with pytest.raises(ConfigError, match="lease timeout"):
            async with pool.alease(timeout=math.nan):
                pass
        async with pool.alease(timeout=30) as sb:
            assert (await sb.arun("print(1)")).ok


# -- caller mistakes: one-line ConfigErrors, never infra_error ------------------------------
@pytest.mark.parametrize("make", [
    lambda: DockerSandboxConfig(mem_limit_mb="256"),
    lambda: DockerSandboxConfig(cpus=math.nan),
    lambda: DockerSandboxConfig(default_timeout=math.inf),
    lambda: DockerSandboxConfig(default_timeout=math.nan),
    lambda: DockerSandboxConfig(host_grace_s=math.nan),
    lambda: DockerSandboxConfig(max_lifetime_s=math.nan),
    lambda: DockerSandboxConfig(pids_limit=64.5),
    lambda: LocalSandboxConfig(mem_limit_mb="1024"),
    lambda: LocalSandboxConfig(default_timeout=math.nan),
    lambda: SandboxPool(size="4"),
    lambda: SandboxPool(size=2.5),
    lambda: SandboxToolEnv([], tasks=[{"prompt": "x"}], lease_timeout=math.nan),
    lambda: SandboxToolEnv([], tasks=[{"prompt": "x"}], pool_size="4"),
], ids=["mem-str", "cpus-nan", "timeout-inf", "timeout-nan", "grace-nan", "lifetime-nan",
        "pids-float", "local-mem-str", "local-timeout-nan", "pool-size-str",
        "pool-size-float", "env-lease-nan", "env-pool-size-str"])
def test_numbers_that_are_not_finite_or_whole_are_refused(make):
    with pytest.raises(ConfigError):
        make()


@pytest.mark.parametrize("call", [
    lambda sb: sb.run(123),
    lambda sb: sb.run(b"print(1)"),
    lambda sb: sb.exec("ls -la"),
    lambda sb: sb.run("print(1)", stdin=5),
    lambda sb: sb.run("print(1)", files={"a.txt": 1}),
], ids=["code-int", "code-bytes", "argv-str", "stdin-int", "file-int"])
def test_call_arguments_of_the_wrong_type_are_config_errors(docker_sb, local_sb, call):
    for sb in (docker_sb, local_sb):
        with pytest.raises(ConfigError):
            call(sb)
    assert not docker_sb.needs_recycle  # before: code that is not text was an infra_error
    assert docker_sb.run("print(1)").ok


@pytest.mark.parametrize("case", [{"input": "\ud800", "output": "x"},
                                  {"input": "", "output": "\udcff"}])
def test_a_stdio_case_no_program_can_read_or_print_is_refused(local_sb, case):
    with pytest.raises(ConfigError, match="not valid Unicode"):
        verify("print(input())", [case], "stdio", sandbox=local_sb)

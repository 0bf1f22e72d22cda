"""Attacks on the hardened sandbox: each is contained, gets the right status, and leaves the
sandbox, the pool and the host working."""

from __future__ import annotations

import json
import os

import pytest

from agentgym.sandboxes import ExecStatus, verify

pytestmark = pytest.mark.docker

PS = """
import json, os
out = []
for p in filter(str.isdigit, os.listdir('/proc')):
    try:
        status = open(f'/proc/{p}/status').read().splitlines()
        uid = int(next(l for l in status if l.startswith('Uid:')).split()[1])
        state = next(l for l in status if l.startswith('State:')).split()[1]
        cmd = open(f'/proc/{p}/cmdline').read().replace(chr(0), ' ').strip()
    except (OSError, StopIteration):
        continue
    if state in ('Z', 'X'):  # already dead, only not yet reaped: nothing of it runs
        continue
    out.append({"pid": int(p), "uid": uid, "cmd": cmd[:60]})
print(json.dumps(out))
"""


def processes(sb) -> list[dict]:
    """Every process visible in the container (procps is not in the image)."""
    return json.loads(sb.run(PS, session=False).stdout)


def assert_still_works(sb):
    r = sb.run("print('alive')")
    assert (r.status, r.stdout) == (ExecStatus.OK, "alive\n"), r
    # what may remain of the code uid: the server, the Python session kernel, and this
    # listing (its reporter process and itself). A SIGKILLed process takes a moment to die,
    # so a few listings are allowed before one counting more is a survivor.
    for _ in range(10):
        procs = processes(sb)
        code = [p for p in procs if p["uid"] == sb.config.code_uid]
        if len(code) <= 4:
            break
    assert len(code) <= 4, f"code processes survived the call: {code}"
    assert all(p["cmd"].startswith("python3 -s -c") for p in code), code
    keeper = [p for p in procs if p["uid"] == sb.config.keeper_uid]
    assert {p["pid"] for p in keeper} >= {1}, "the keeper must be alive"


def test_network_access_is_blocked(sb):
    r = sb.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)")
    assert r.status is ExecStatus.ERROR and "Network is unreachable" in r.stderr, r
    assert sb.run("import os; print(sorted(os.listdir('/sys/class/net')))").stdout == "['lo']\n"
    assert_still_works(sb)


def test_fork_bomb_is_contained(sb):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = sb.run(bomb, timeout=2)
    assert r.status is ExecStatus.TIMEOUT
    assert_still_works(sb)


BOMB = "blocks = []\nwhile True:\n    blocks.append(b'x' * (64 * 1024 * 1024))"


@pytest.mark.parametrize("how", ["session", "fresh", "bash", "huge"])
def test_memory_bomb_is_oom(sb, how):
    sb.run("survivor = 7")
    if how == "bash":
        r = sb.run(f"python3 -c \"{BOMB}\"", language="bash", timeout=20)
    elif how == "huge":
        r = sb.run("x = bytearray(10 ** 13)")
    else:
        r = sb.run(BOMB, timeout=20, session=how == "session")
    assert r.status is ExecStatus.OOM, r
    assert sb.run("print(survivor)").stdout == "7\n", "the Python session must survive"
    assert_still_works(sb)


@pytest.mark.parametrize("how", ["session", "fresh", "bash"])
def test_infinite_loop_times_out(sb, how):
    sb.run("survivor = 7")
    if how == "bash":
        r = sb.run("while :; do :; done", language="bash", timeout=1)
    else:
        r = sb.run("while True:\n    pass", timeout=1, session=how == "session")
    assert r.status is ExecStatus.TIMEOUT and r.exit_code == -9 and r.duration < 3
    assert sb.run("print(survivor)").stdout == "7\n", "the Python session must survive"
    assert_still_works(sb)


def test_detached_setsid_child_dies_with_the_call(sb):
    code = ("import subprocess, time\n"
            "subprocess.Popen(['setsid', 'sh', '-c', 'sleep 300'])\n"
            "subprocess.Popen(['sleep', '301'], start_new_session=True)\n"
            "time.sleep(60)")
    r = sb.run(code, timeout=1)
    assert r.status is ExecStatus.TIMEOUT and r.duration < 3
    left = [p for p in processes(sb) if "sleep 30" in p["cmd"]]
    assert left == [], f"detached children survived: {left}"
    assert_still_works(sb)


def test_100mb_of_output_is_capped_at_the_source(sb):
    r = sb.run("import sys\nsys.stdout.write('x' * 100_000_000)\nsys.stdout.flush()", timeout=20)
    assert r.status is ExecStatus.OUTPUT_LIMIT and r.truncated
    assert len(r.stdout) + len(r.stderr) <= sb.config.output_limit_bytes
    r = sb.run("while True:\n    print('y' * 1000)", timeout=20)
    assert r.status is ExecStatus.OUTPUT_LIMIT and r.duration < 5
    assert_still_works(sb)


@pytest.mark.parametrize("path", ["/etc/agentgym-pwned", "/usr/bin/pwned", "/pwned",
                                  "/proc/sys/kernel/pwned"])
def test_writing_outside_the_work_dir_fails(sb, path):
    r = sb.run(f"open({path!r}, 'w').write('x')")
    assert r.status is ExecStatus.ERROR
    assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr \
        or "No such file" in r.stderr
    assert sb.exec(["test", "-e", path]).exit_code == 1, f"{path} exists in the container"
    assert_still_works(sb)


def test_reading_host_files_fails(sb):
    host_file = os.path.abspath(__file__)
    assert os.path.exists(host_file)
    r = sb.run(f"print(open({host_file!r}).read())")
    assert r.status is ExecStatus.ERROR and "FileNotFoundError" in r.stderr
    for path in ("/etc/shadow", "/proc/1/environ"):
        r = sb.run(f"print(open({path!r}).read())")
        assert r.status is ExecStatus.ERROR and "PermissionError" in r.stderr, (path, r)
    r = sb.run("import os; print(os.path.exists('/var/run/docker.sock'))")
    assert r.stdout == "False\n"
    assert_still_works(sb)


def test_killing_the_keeper_fails(sb):
    keepers = [p["pid"] for p in processes(sb) if p["uid"] == sb.config.keeper_uid]
    assert 1 in keepers and len(keepers) >= 2  # docker-init and cat
    r = sb.run("import os, signal\ndenied = 0\n"
               f"for pid in {keepers}:\n"
               "    try:\n        os.kill(pid, signal.SIGKILL)\n"
               "    except PermissionError:\n        denied += 1\nprint(denied)")
    assert r.stdout == f"{len(keepers)}\n", r
    r = sb.run("import os, signal\nos.kill(-1, signal.SIGKILL)")  # kills everything it may
    assert r.status is ExecStatus.ERROR
    sb._container.reload()
    assert sb._container.status == "running"
    assert_still_works(sb)


def test_filling_the_tmpfs_fails_cleanly(sb):
    code = ("chunk = b'x' * (1 << 20)\n"
            "with open({!r}, 'wb') as fh:\n"
            "    for _ in range(1000):\n"
            "        fh.write(chunk)")
    r = sb.run(code.format("/work/fill"), timeout=20)
    assert r.status is ExecStatus.ERROR
    assert "No space left" in r.stderr or "File too large" in r.stderr
    r = sb.run(code.format("/tmp/fill"), timeout=20)
    assert r.status is ExecStatus.ERROR
    sb.reset()
    assert sb.run("open('/work/small', 'w').write('ok')").ok
    assert_still_works(sb)


# Every fd the code could have inherited from the harness gets garbage: lines, a forged-looking
# reply, and bytes with no newline (glued to whatever the harness writes next).
FD_GARBAGE = (
    "import os\n"
    "junk = b'garbage\\n{\"exit_code\": 0, \"id\": 1}\\n\\x00\\xffno newline'\n"
    "for fd in range(3, 256):\n"
    "    try:\n"
    "        os.write(fd, junk)\n"
    "    except OSError:\n"
    "        pass\n"
)


@pytest.mark.parametrize("session", [True, False])
def test_writing_garbage_to_every_fd_is_the_codes_own_outcome(sb, session):
    sb.run("survivor = 7")
    r = sb.run(FD_GARBAGE + "print('done')", session=session)
    assert (r.status, r.stdout, r.infra_error) == (ExecStatus.OK, "done\n", None), r
    r = sb.run(FD_GARBAGE + "raise SystemExit(3)", session=session)
    assert (r.status, r.exit_code, r.infra_error) == (ExecStatus.ERROR, 3, None), r
    assert sb.run("print(survivor)").stdout == "7\n", "the Python session must survive"
    assert_still_works(sb)


def test_fresh_code_holds_no_fd_of_the_harness(sb):
    listing = "import os\nprint(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"
    # 0-2 and the fd of the /proc/self/fd listing itself; nothing of the server
    assert sb.run(listing, session=False).stdout == "[0, 1, 2, 3]\n"
    assert sb.exec(["ls", "/proc/self/fd"]).stdout.split() == ["0", "1", "2", "3"]


def test_writing_garbage_to_every_fd_cannot_dodge_a_zero_in_verify(sb):
    wrong = FD_GARBAGE + "def add(a, b):\n    return a - b\n"
    res = verify(wrong, ["assert add(1, 2) == 3", "assert add(2, 2) == 4"], sandbox=sb)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res
    # a right answer that trashes its own test's result pipe is scored too (0 or 1), never None
    right = FD_GARBAGE + "def add(a, b):\n    return a + b\n"
    assert verify(right, ["assert add(1, 2) == 3"], sandbox=sb).reward in (0.0, 1.0)
    assert_still_works(sb)


def test_pool_serves_working_sandboxes_after_the_attacks(pool):
    with pool.lease() as a, pool.lease() as b, pool.lease() as c:
        for sb in (a, b, c):
            assert_still_works(sb)
            assert sb.exec(["ls", "-A"]).stdout == "", "leftover files from an earlier lease"


# A session cell holds the kernel's control socket (it becomes the next kernel): what it writes
# there must never become a failure of the server, which the host scores as infra_error, and a
# policy could then turn any episode it expects to lose into one dropped from training.
TO_THE_KERNEL_SOCKET = (
    "import os, socket, stat\n"
    "for fd in map(int, os.listdir('/proc/self/fd')):\n"
    "    try:\n"
    "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
    "            socket.socket(fileno=os.dup(fd)).send({line!r})\n"
    "    except OSError:\n"
    "        pass\n"
)


@pytest.mark.parametrize(
    "line",
    [
        b'{"id": 0, "x": ' + b"[" * 20_000 + b"\n",  # RecursionError in the server's json.loads
        b'{"exit_code": true, "memory_error": "yes", "kernel": -1}\n',
        b'{"exit_code": 0, "kernel": "1"}\n',
    ],
    ids=["nested-20000-deep", "wrong-types", "pid-as-text"],
)
def test_lines_written_to_the_kernel_socket_are_the_codes_own_outcome(sb, line):
    r = sb.run(TO_THE_KERNEL_SOCKET.format(line=line) + "print('sent')", session=True)
    assert (r.status, r.stdout, r.infra_error) == (ExecStatus.OK, "sent\n", None), r
    assert_still_works(sb)


def test_a_kernel_reporting_its_pid_as_text_is_not_a_server_failure(sb):
    """The cell patches ``os.getpid`` in the kernel, so the kernel's own reply names it as
    text: the server stored it, killed the real kernel as a stray, and raised TypeError
    killing the text on the next call."""
    r = sb.run("import os\n_pid = os.getpid()\nos.getpid = lambda: str(_pid)", timeout=3)
    assert r.infra_error is None and r.status in (ExecStatus.OK, ExecStatus.TIMEOUT), r
    after = sb.run("print(1)")
    assert (after.status, after.stdout, after.infra_error) == (ExecStatus.OK, "1\n", None), after
    assert_still_works(sb)

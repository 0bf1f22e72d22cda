"""A sandbox reused for several verifications judges each sample on its own.

Found by a probe of "reuse sandboxes to verify rewards": one sample's code (chmod /work 000,
a full /tmp, a file left behind) made the next, correct sample score 0 as its own failure;
stdio mode failed a correct program ending with ``os._exit(0)`` and scored one that killed its
parent at random; a session cell's unwritable output showed up in the next cell.
"""

from __future__ import annotations

import pytest

from agentgym.sandboxes import LocalSandbox, verify

GOOD = "def f(x):\n    return x + 1\n"
TESTS = ["assert f(1) == 2"]
PYTESTS = "from solution import f\n\ndef test_f():\n    assert f(1) == 2\n"
STDIO = [{"input": "", "output": ""}]
FILL = "".join(
    f"try:\n    with open('{p}/fill', 'wb') as fh:\n        while True:\n"
    f"            fh.write(b'0' * (1 << 20))\nexcept OSError:\n    pass\n"
    for p in ("/tmp", "/work")
)
LEAVE = "open('/work/answer_cache', 'w').write('sample A was here')\n"
SEES_LEFTOVER = ("import os\nassert not os.path.exists('/work/answer_cache'), "
                 "'saw an earlier sample'\n")


def _all_modes_pass(sb, code: str = GOOD) -> None:
    for mode, tests in (("assert", TESTS), ("pytest", PYTESTS), ("stdio", STDIO)):
        res = verify(code, tests, mode=mode, sandbox=sb)
        assert (res.status, res.reward) == ("passed", 1.0), (mode, res.tests, res.exec_result)


@pytest.mark.parametrize("attack", ["import os\nos.chmod('/work', 0)\n", FILL, LEAVE],
                         ids=["chmod_work_000", "fill_tmp_and_work", "leave_file"])
def test_a_sample_cannot_fail_the_next_one_in_a_reused_lease(sb, attack):
    first = verify(attack + GOOD, TESTS, sandbox=sb)
    assert first.status == "passed", first.tests
    for _ in range(2):  # not only the first verification after it
        _all_modes_pass(sb, GOOD + (SEES_LEFTOVER if attack == LEAVE else ""))


def test_a_bare_sandbox_is_clean_for_every_verification(docker_ready):
    from agentgym.sandboxes import DockerSandbox

    with DockerSandbox() as box:
        box.run("import os\nos.chmod('/work', 0)\nopen('/tmp/x', 'w').write('x')", session=True)
        res = verify(GOOD + "import os\nassert not os.listdir('/tmp')\n", TESTS, sandbox=box)
        assert res.status == "passed", res.tests
        # verify ended the session and restored /work: a plain run works again
        run = box.run("import os\nprint(os.getcwd())", session=False)
        assert (run.status.value, run.stdout) == ("ok", "/work\n"), run


def test_a_run_that_cannot_enter_the_work_dir_says_why(sb):
    sb.run("import os\nos.chmod('/work', 0)", session=False)
    run = sb.run("print(1)", session=False)
    assert run.status.value == "error" and run.infra_error is None
    assert "cannot enter the work dir /work" in run.stderr and "reset()" in run.stderr, run
    session = sb.run("print(1)", session=True)  # no session yet: it cannot start either
    assert "cannot enter the work dir /work" in session.stderr, session


def test_a_live_session_can_undo_its_own_chmod(sb):
    sb.run("import os\nos.chmod('/work', 0)", session=True)
    assert sb.run("print(2)", session=True).stdout == "2\n"
    sb.run("import os\nos.chmod('/work', 0o700)", session=True)
    assert sb.run("print(3)", session=False).stdout == "3\n"


def test_local_sandbox_verifies_each_sample_in_a_fresh_work_dir():
    with LocalSandbox() as box:
        first = verify("import os\nos.chmod('.', 0)\n" + GOOD, TESTS, sandbox=box)
        assert first.status == "passed", first.tests
        marker = verify("open('answer_cache', 'w').write('A')\n" + GOOD, TESTS, sandbox=box)
        assert marker.status == "passed", marker.tests
        later = verify(GOOD + "import os\nassert not os.path.exists('answer_cache')\n", TESTS,
                       sandbox=box)
        assert later.status == "passed", later.tests
        assert box.run("print(4)").stdout == "4\n"  # its own work dir is untouched


def test_local_reset_removes_a_work_dir_the_code_locked():
    with LocalSandbox() as box:
        box.run("import os\nos.makedirs('d/e')\nopen('d/e/f', 'w')\nos.chmod('d', 0)\n"
                "os.chmod('.', 0)")
        box.reset()
        run = box.run("import os\nprint(os.listdir('.'))")
        assert run.stdout == "[]\n", run


# --- stdio: judged by the program's exit status and output ---------------------------------

DOUBLE = [{"input": f"{i}\n", "output": f"{2 * i}\n"} for i in range(4)]


@pytest.mark.parametrize("ending", ["import os, sys\nsys.stdout.flush()\nos._exit(0)",
                                    "import sys\nsys.exit(0)", "pass"])
def test_stdio_program_ending_with_os_exit_0_passes(sb, ending):
    code = f"print(int(input()) * 2)\n{ending}\n"
    res = verify(code, DOUBLE, mode="stdio", sandbox=sb)
    assert (res.status, res.reward) == ("passed", 1.0), res.tests


@pytest.mark.parametrize("ending, message", [
    ("import os\nos._exit(3)", "the program exited with status 3"),
    ("import sys\nsys.exit(1)", "SystemExit(1) before the test finished"),
    ("raise ValueError('x')", "ValueError: x"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
     "the program was killed by signal 9"),
])
def test_stdio_program_that_does_not_end_well_fails_with_why(sb, ending, message):
    res = verify(f"import sys\nprint(int(input()) * 2)\nsys.stdout.flush()\n{ending}\n",
                 DOUBLE[:1], mode="stdio", sandbox=sb)
    assert res.status == "failed" and res.reward == 0.0
    assert res.tests[0].message == message, res.tests


KILL_PARENT = ("import os, signal\nprint(int(input()) * 2, flush=True)\n"
               "os.kill(os.getppid(), signal.SIGKILL)\n")
KILL_FACTORY = (
    "import os, signal, time\nprint(int(input()) * 2, flush=True)\n"
    "def ppid(pid):\n"
    "    for line in open(f'/proc/{pid}/status'):\n"
    "        if line.startswith('PPid:'):\n"
    "            return int(line.split()[1])\n"
    "os.kill(ppid(os.getppid()), signal.SIGKILL)\n"
)


@pytest.mark.parametrize("code", [KILL_PARENT, KILL_FACTORY], ids=["parent", "factory"])
def test_stdio_program_that_kills_its_harness_always_fails(sb, code):
    for _ in range(3):
        res = verify(code, DOUBLE, mode="stdio", sandbox=sb)
        assert (res.status, res.reward) == ("failed", 0.0), res.tests
        assert all("killed its test harness" in t.message for t in res.tests), res.tests


# --- the Python session: a cell's output is its own ----------------------------------------

def test_output_a_cell_could_not_write_is_not_the_next_cells(sb):
    first = sb.run("import os\nos.close(1)\nprint('output of cell 1')", session=True)
    assert first.status.value == "ok" and first.stdout == ""
    assert sb.run("print('cell 2')", session=True).stdout == "cell 2\n"
    sb.run("import os, sys\nos.close(2)\nsys.stderr.write('err of cell 3')", session=True)
    assert sb.run("import sys\nsys.stderr.write('e')", session=True).stderr == "e"


# --- a sandbox that cannot be cleaned: replaced, or infra_error, never the sample's failure --

def _leave_what_the_code_cannot_remove(box) -> None:
    """A folder of the code's holding one of root's (no code can do this; a broken image can)."""
    box.run("import os\nos.mkdir('/work/d')\nfor p in ('/work', '/work/d'):\n"
            "    os.chmod(p, 0o777)", session=False)
    made = box._container.exec_run(["sh", "-c", "mkdir /work/d/e && touch /work/d/e/f"],
                                   user="0:0")
    assert made.exit_code == 0, made.output


def test_a_sandbox_the_server_cannot_clean_is_replaced_before_verifying(docker_ready):
    from agentgym.sandboxes import DockerSandbox

    with DockerSandbox() as box:
        _leave_what_the_code_cannot_remove(box)
        before = box.container_id
        res = verify(GOOD, TESTS, sandbox=box)
        assert res.status == "passed", (res.tests, res.exec_result)
        assert box.container_id != before  # soft and hard clean-up failed: a new container


def test_a_sandbox_that_cannot_be_cleaned_at_all_is_infra_error(docker_ready, monkeypatch):
    from agentgym._errors import SandboxError
    from agentgym.sandboxes import DockerSandbox

    with DockerSandbox() as box:
        _leave_what_the_code_cannot_remove(box)

        def no_reset(hard: bool = False) -> None:
            raise SandboxError("the daemon is gone")

        monkeypatch.setattr(box, "reset", no_reset)
        res = verify(GOOD, TESTS, sandbox=box)
        assert (res.status, res.reward) == ("infra_error", None)
        assert "could not be cleaned" in res.infra_error and "/work still holds d" in \
            res.infra_error, res.infra_error

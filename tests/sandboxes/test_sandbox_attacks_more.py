"""More reward hacks against the sandboxes, written as the policy being trained would try them.

Each test asserts the classification the project rule demands: the code cannot make a wrong
answer pass, cannot turn its failure into ``infra_error`` (dropped from GRPO statistics, so a
failing policy would prefer it), and leaves nothing a later lease of the same container sees.
``test_sandbox_attacks.py`` and ``test_sandbox_verify.py`` hold the attacks covered before.
"""

from __future__ import annotations

import io
import json
import tarfile
import time

import pytest

from agentgym.sandboxes import ExecStatus, verify
from agentgym.sandboxes._verify import MARKER
from tests.sandboxes.test_sandbox_attacks import assert_still_works

pytestmark = pytest.mark.docker

WRONG_ADD = "def add(a, b):\n    return 7\n"
ASSERT_TESTS = ["assert add(1, 2) == 3"]
PYTEST_TESTS = "from solution import add\n\ndef test_0():\n    assert add(1, 2) == 3\n"
FORGED_REPORT = MARKER + json.dumps({
    "tests": [{"name": "test_0", "passed": True, "status": "passed", "message": "",
               "duration": 0.0}],
    "runner": "assert",
})
# A module that, once imported by the runner, prints a passing report and ends the runner.
PRINTS_A_PASS = f"import os\nos.write(1, {(FORGED_REPORT + chr(10)).encode()!r})\nos._exit(0)\n"


def suite_for(mode: str):
    return ASSERT_TESTS if mode == "assert" else PYTEST_TESTS


# --- the runner's own imports ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["assert", "pytest"])
def test_modules_left_in_the_work_dir_are_not_imported_by_the_runner(sb, mode):
    # A tool call earlier in the lease (or a restored snapshot) leaves modules the runner
    # imports in /work, its cwd, which used to come first on its sys.path.
    planted = {f"{name}.py": PRINTS_A_PASS for name in ("tempfile", "ast", "importlib", "pytest")}
    assert sb.run("pass", files=planted, session=False).ok
    res = verify(WRONG_ADD, suite_for(mode), mode, sandbox=sb)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests
    assert res.runner == mode


PASS_EVERYTHING_CONFTEST = (
    "import pytest\n\n"
    "@pytest.hookimpl(tryfirst=True)\n"
    "def pytest_pyfunc_call(pyfuncitem):\n"
    "    return True  # the test body never runs\n"
)


@pytest.mark.parametrize("config", ["pytest.ini", None])
def test_a_conftest_left_in_tmp_is_not_loaded_by_pytest(sb, config):
    # pytest looks for conftest.py (and config files) in every parent of its workspace,
    # /tmp/agentgym-verify-*, and would import this one into the judge.
    files = {"conftest.py": PASS_EVERYTHING_CONFTEST, **({config: "[pytest]\n"} if config else {})}
    plant = "".join(f"open('/tmp/{name}', 'w').write({body!r})\n" for name, body in files.items())
    assert sb.run(plant, session=False).ok
    res = verify(WRONG_ADD, PYTEST_TESTS, "pytest", sandbox=sb)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests


PLANT_FROM_A_SESSION_THREAD = f"""
import os, threading, time
def plant():
    while True:
        for name in os.listdir("/tmp"):
            if name.startswith("agentgym-verify-"):
                try:
                    with open(f"/tmp/{{name}}/conftest.py", "w") as fh:
                        fh.write({PASS_EVERYTHING_CONFTEST!r})
                except OSError:
                    pass
        time.sleep(0.0005)
threading.Thread(target=plant, daemon=True).start()
"""


def test_a_thread_left_in_the_agents_session_cannot_plant_a_conftest(sb):
    # An agent's tool call (a session cell) leaves a thread that writes conftest.py into the
    # pytest judge's workspace while the tests collect: verification ends the session first.
    assert sb.run(PLANT_FROM_A_SESSION_THREAD, session=True).ok
    res = verify(WRONG_ADD, PYTEST_TESTS, "pytest", sandbox=sb)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests
    after = sb.run("print(threading.active_count())", session=True)
    assert "the Python session was lost" in after.stderr, after
    assert "NameError" in after.stderr  # a new session: the planter's globals are gone


@pytest.mark.parametrize("mode", ["assert", "pytest"])
def test_a_stop_iteration_from_the_candidate_does_not_end_the_tests_loops(sb, mode):
    # Rebuilt as StopIteration in the judge, it ended the test's map() early: all() saw no
    # item and any() none, so both asserts held for a function that only raises.
    code = "def is_even(x):\n    raise StopIteration\n"
    checks = ["assert all(map(is_even, [2, 4, 6]))", "assert not any(map(is_even, [1, 3]))"]
    tests = checks if mode == "assert" else "from solution import is_even\n\n" + "".join(
        f"def test_{k}():\n    {check}\n\n" for k, check in enumerate(checks))
    res = verify(code, tests, mode, sandbox=sb)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests
    assert all("is_even() raised StopIteration" in t.message for t in res.tests), res.tests


def test_a_timeout_error_the_code_raises_is_a_failure_not_a_timeout(sb):
    # The judge told its own per-test timeout by the message, which the code can write too.
    code = ("import time\n"
            "def add(a, b):\n"
            "    raise TimeoutError('test exceeded 5s')\n"  # the judge's own words
            "def slow(a, b):\n"
            "    time.sleep(60)\n")
    tests = ("from solution import add, slow\n\n"
             "def test_add():\n    assert add(1, 2) == 3\n\n"
             "def test_slow():\n    slow(1, 2)\n")
    # 5 s: test_add starts the solution process, which must not time out on a loaded machine
    res = verify(code, tests, "pytest", sandbox=sb, per_test_timeout=5)
    assert {t.name: t.status for t in res.tests} == {"test_add": "failed", "test_slow": "timeout"}


BROADCAST_SIGALRM = (
    "    for pid in os.listdir('/proc'):\n"
    "        if pid.isdigit() and int(pid) not in (1, os.getpid()):\n"
    "            try:\n"
    "                os.kill(int(pid), signal.SIGALRM)\n"
    "            except OSError:\n"
    "                pass\n"
)


def test_a_forged_sigalrm_does_not_pass_a_raises_test(sb):
    # The judge turns SIGALRM into TimeoutError (the per-test timeout); the candidate, same
    # uid, sends one itself so that `pytest.raises(Exception)` sees an exception it never
    # raised. Its parent (the factory, formerly the judge) ignores it; the judge takes only
    # the timer's alarm; one sent to every process also ends the runner: the sample fails.
    code = ("import os, signal\n"
            "def add(a, b):\n"
            "    os.kill(os.getppid(), signal.SIGALRM)\n"
            "    return a + b\n")
    tests = ("import pytest\nfrom solution import add\n\n"
             "def test_rejects_negatives():\n"
             "    with pytest.raises(Exception):\n"
             "        add(-1, 2)\n\n"
             "def test_adds():\n"
             "    assert add(1, 2) == 3\n")
    res = verify(code, tests, "pytest", sandbox=sb)
    assert {t.name: t.status for t in res.tests} == {
        "test_rejects_negatives": "failed", "test_adds": "passed"}, res.tests
    assert "DID NOT RAISE" in res.tests[0].message
    everyone = "import os, signal\ndef add(a, b):\n" + BROADCAST_SIGALRM + "    return a + b\n"
    res = verify(everyone, tests, "pytest", sandbox=sb)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests
    assert_still_works(sb)


# --- state that used to outlive a lease --------------------------------------------------------

SYSV = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
"""
LEAVE_IPC = SYSV + """
shm = libc.shmget(0x5eed, 1 << 20, 0o1600)
addr = libc.shmat(shm, None, 0)
ctypes.memmove(addr, b"answer for the next episode", 27)
libc.shmdt(addr)
queue = libc.msgget(0x5eed, 0o1600)
msg = ctypes.create_string_buffer(b"\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00answer", 14)
assert libc.msgsnd(queue, msg, 6, 0) == 0
assert libc.semget(0x5eed, 1, 0o1600) >= 0
os.close(os.open("/dev/mqueue/answer", os.O_CREAT | os.O_WRONLY, 0o600))
"""
LIST_IPC = """
import os
print(sum(len(open(f"/proc/sysvipc/{k}").readlines()) - 1 for k in ("shm", "msg", "sem")),
      os.listdir("/dev/mqueue"))
"""


def test_sysv_ipc_and_message_queues_do_not_survive_a_reset(sb):
    # System V shared memory, message queues, semaphores and POSIX message queues live in the
    # container's IPC namespace, not in any process or wiped directory. A reset is what a
    # pool does between leases.
    r = sb.run(LEAVE_IPC, session=False)
    assert r.ok, r
    assert sb.run(LIST_IPC, session=False).stdout == "3 ['answer']\n"
    sb.reset()
    assert sb.run(LIST_IPC, session=False).stdout == "0 []\n"
    assert_still_works(sb)


def test_sysv_shared_memory_cannot_starve_the_next_lease(sb):
    # 400 MiB of the 512 MiB limit held in segments no process has attached: the next
    # episode's ordinary 200 MiB allocation would be killed as its own `oom`.
    fill = SYSV + ("for _ in range(50):\n"
                   "    seg = libc.shmget(0, 8 << 20, 0o1600)\n"
                   "    addr = libc.shmat(seg, None, 0)\n"
                   "    ctypes.memset(addr, 1, 8 << 20)\n"
                   "    libc.shmdt(addr)\n")
    assert sb.run(fill, session=False, timeout=20).ok
    sb.reset()
    r = sb.run("x = bytearray(200 << 20)\nprint('ok')", session=False, timeout=20)
    assert (r.status, r.stdout) == (ExecStatus.OK, "ok\n"), r


def test_directories_the_code_made_unlistable_do_not_survive_a_reset(sb):
    # rmtree cannot list (or empty) a directory without read/write permission: with the
    # top-level one 000, 0300 or 0500, it and its files stayed for the next lease.
    code = ("import os\n"
            "for root in ('/work', '/tmp', '/dev/shm'):\n"
            "    for mode in (0o000, 0o300, 0o500):\n"
            "        d = f'{root}/hidden{mode:o}'\n"
            "        os.makedirs(d + '/sub')\n"
            "        open(d + '/sub/answer', 'w').write('42')\n"
            "        os.chmod(d + '/sub', mode)\n"
            "        os.chmod(d, mode)\n")
    assert sb.run(code, session=False).ok
    sb.reset()
    listing = "import os\nprint([os.listdir(r) for r in ('/work', '/tmp', '/dev/shm')])"
    assert sb.run(listing, session=False).stdout == "[[], [], []]\n"
    assert_still_works(sb)


# --- infra_error on demand ---------------------------------------------------------------------

# Threads of a session cell live on in the kernel: this cell takes every pid before it returns,
# and a thread keeps taking every pid that frees up, so the pids limit stays full between calls.
FILL_PIDS = """
import os, threading
forever = threading.Event()
def take_every_pid():
    while True:
        try:
            threading.Thread(target=forever.wait, daemon=True).start()
        except RuntimeError:
            return
def grab():
    while True:
        take_every_pid()
        os.sched_yield()
threading.Thread(target=grab, daemon=True).start()
take_every_pid()
"""


def test_session_threads_filling_the_pids_limit_do_not_make_calls_infra_errors(sb):
    # The server forks every fresh call; with no pid left that fork used to fail, and the
    # failure came back as infra_error: a shell tool call (or verify) the episode then drops.
    # Now the session that holds the pids is ended and the call runs (or, if a pid was left
    # for the server but none for the code, the call is the code's error).
    right = "def add(a, b):\n    return a + b\n"
    calls = [
        lambda: sb.run("echo hi", language="bash"),
        lambda: sb.run("print(1)", session=False),
        lambda: verify(WRONG_ADD, ASSERT_TESTS, sandbox=sb),
        lambda: verify(right, ASSERT_TESTS, sandbox=sb),
    ]
    outcomes = []
    for call in calls:
        filled = sb.run(FILL_PIDS)  # a full old session fails this cell: the code's error
        assert filled.infra_error is None, filled
        outcomes.append(call())
    assert [r.infra_error for r in outcomes] == [None] * 4, outcomes
    assert all(r.status in (ExecStatus.OK, ExecStatus.ERROR) for r in outcomes[:2]), outcomes
    assert (outcomes[2].reward, outcomes[2].status) == (0.0, "failed"), outcomes[2]
    assert outcomes[3].reward is not None, outcomes[3]
    # The last filled session may still hold every pid (a fresh call that found one free left
    # it be). Its next cell then cannot start: the code's error, which ends that session.
    late = sb.run("print('alive')")
    assert late.infra_error is None, late
    assert late.stdout == "alive\n" or "could not start this cell" in late.stderr, late
    assert_still_works(sb)


# Takes every pid, and once the kernel that ran the cell before it is gone (its pid freed too),
# takes that one and says so in /work/full: from then on no pid is free. Its thread starts
# while pids are left and calls `take_every_pid` (defined below) after the cell.
FILL_PIDS_THEN_SAY = """
import os, threading
parent = os.getppid()
def say_when_full():
    while os.path.exists(f'/proc/{parent}'):
        os.sched_yield()
    take_every_pid()
    open('/work/full', 'w').close()
threading.Thread(target=say_when_full, daemon=True).start()
""" + FILL_PIDS


def test_a_session_holding_every_pid_fails_its_next_cell_as_the_codes_error(sb):
    # Nothing ends the filled session first here: its kernel cannot fork the cell, says why and
    # ends, so the cell is the code's error and the one after it runs in a new session.
    assert sb.run(FILL_PIDS_THEN_SAY).infra_error is None
    wait_for_work_file(sb, "full")
    late = sb.run("print('alive')")
    assert late.infra_error is None, late  # the code's doing: never the machinery's
    # the grabbing thread races every exiting process for its pid; on a loaded machine a pid
    # freed after 'full' reached the kernel's fork first (seen once in CI): the cell then ran
    assert late.status == ExecStatus.ERROR or late.stdout == "alive\n", late
    if late.status == ExecStatus.ERROR:
        assert "could not start this cell" in late.stderr, late
    assert_still_works(sb)


def wait_for_work_file(sb, name: str) -> None:
    """Poll snapshots until /work/NAME exists: the server tars the work dir itself, starting no
    process (a call would need a pid)."""
    deadline = time.monotonic() + 30
    while True:
        with tarfile.open(fileobj=io.BytesIO(sb.snapshot().tar)) as tar:
            if name in tar.getnames():
                return
        assert time.monotonic() < deadline, f"/work/{name} did not appear"
        time.sleep(0.05)


# The session kernel's main thread exits (pthread_exit from a signal handler) once the cell has
# replied, while a thread of it runs on (and, with FILL, takes every pid): the process shows
# state Z, which the server read as a dead kernel and its sweeps skipped, so the thread
# outlived every call and reset, and a full pids limit made the next call infra_error.
ZOMBIE_KERNEL = """
import ctypes, os, signal, threading, time
libc = ctypes.CDLL(None)
signal.signal(signal.SIGUSR1, lambda *a: libc.pthread_exit(None))
main = threading.main_thread().ident
forever = threading.Event()
def survive():
    time.sleep(1.5)  # the cell has replied: the kernel waits for its next cell
    signal.pthread_kill(main, signal.SIGUSR1)
    while open('/proc/self/status').read().split('State:')[1].split()[0] != 'Z':
        time.sleep(0.01)
    while FILL:
        try:
            threading.Thread(target=forever.wait, daemon=True).start()
        except RuntimeError:
            break
    open('/work/zombie', 'w').close()
    forever.wait()
threading.Thread(target=survive, daemon=True).start()
print(os.getpid())
"""


def planted_zombie_kernel(sb, fill: bool) -> int:
    """Plant `ZOMBIE_KERNEL`; return its pid once its main thread has exited."""
    planted = sb.run(ZOMBIE_KERNEL.replace("FILL", str(fill)))
    assert planted.status == ExecStatus.OK, planted
    wait_for_work_file(sb, "zombie")
    return int(planted.stdout)


def test_a_kernel_whose_main_thread_exited_is_killed_not_kept(sb):
    # holding every pid, it made the next session call fail to start a kernel: infra_error
    planted_zombie_kernel(sb, fill=True)
    r = sb.run("print('hi')")
    assert (r.infra_error, r.stdout) == (None, "hi\n"), r
    assert "the Python session was lost" in r.stderr
    assert_still_works(sb)


def test_a_kernel_whose_main_thread_exited_does_not_outlive_a_reset(sb):
    # it would act in the next lease of the container: read and write its /work
    pid = planted_zombie_kernel(sb, fill=False)
    sb.reset()
    gone = sb.run(f"import os\nprint(os.path.exists('/proc/{pid}'))", session=False)
    assert gone.stdout == "False\n", gone
    assert_still_works(sb)


def test_a_fork_bomb_in_verify_fails_the_sample_not_the_sandbox(sb):
    bomb = ("import os\n"
            "while True:\n"
            "    try:\n"
            "        os.fork()\n"
            "    except OSError:\n"
            "        pass\n")
    res = verify(bomb + WRONG_ADD, ASSERT_TESTS * 2, sandbox=sb, per_test_timeout=1,
                 total_timeout=4)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests
    assert_still_works(sb)


LOCK_WORK_DIR_AND_KILL_THE_SERVER = """
import os, signal
os.chmod('/work', 0)
for pid in filter(str.isdigit, os.listdir('/proc')):
    status = open(f'/proc/{pid}/status').read()
    uid, ppid = (int(status.split(key)[1].split()[0]) for key in ('Uid:', 'PPid:'))
    if uid == os.getuid() and ppid == 0:  # started by docker exec: the code server
        os.kill(int(pid), signal.SIGKILL)
"""


FILL_PIDS_AND_KILL_THE_SERVER = FILL_PIDS + """
import signal
for pid in filter(str.isdigit, os.listdir('/proc')):
    status = open(f'/proc/{pid}/status').read()
    uid, ppid = (int(status.split(key)[1].split()[0]) for key in ('Uid:', 'PPid:'))
    if uid == os.getuid() and ppid == 0:  # started by docker exec: the code server
        os.kill(int(pid), signal.SIGKILL)
forever.wait()
"""


@pytest.mark.parametrize("call", ["run", "verify"])
def test_a_server_killed_with_every_pid_taken_is_the_codes_failure(sb, call):
    # With the pids limit full when the server dies, no docker exec can start in the
    # container: the host cannot kill the code nor restart the server there. That used to be
    # "container lost": infra_error, an episode dropped instead of scored.
    if call == "run":
        r = sb.run(FILL_PIDS_AND_KILL_THE_SERVER, session=False)
        assert (r.infra_error, r.status) == (None, ExecStatus.ERROR), r
        assert "the code server died during this call" in r.stderr
    else:
        res = verify(FILL_PIDS_AND_KILL_THE_SERVER + WRONG_ADD, ASSERT_TESTS, sandbox=sb)
        assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests
    assert_still_works(sb)


def test_a_locked_work_dir_and_a_killed_server_are_the_codes_failure(sb):
    # The host restarts a killed server with a docker exec whose cwd is the work dir; were
    # that to fail, the call would be infra_error. And the reset must open the dir again
    # (it used to fail, and the container was replaced).
    container = sb.container_id
    res = verify(LOCK_WORK_DIR_AND_KILL_THE_SERVER + WRONG_ADD, ASSERT_TESTS, sandbox=sb)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests
    sb.reset()
    assert sb.container_id == container
    assert_still_works(sb)


HUGE = {
    "stdio: 50 MB on stdout": ("import sys\nsys.stdout.write('x' * 50_000_000)\n", "stdio"),
    "assert: a 15 MB result": ("def add(a, b):\n    return 'x' * 15_000_000\n", "assert"),
    "assert: a 15 MB exception": ("def add(a, b):\n    raise ValueError('x' * 15_000_000)\n",
                                  "assert"),
    "pytest: a 15 MB result": ("def add(a, b):\n    return 'x' * 15_000_000\n", "pytest"),
}


@pytest.mark.parametrize("attack", HUGE)
def test_huge_output_fails_the_sample_not_the_sandbox(sb, attack):
    code, mode = HUGE[attack]
    tests = [{"input": "1 2", "output": "3"}] if mode == "stdio" else suite_for(mode)
    res = verify(code, tests, mode, sandbox=sb)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests
    assert all(len(t.message) <= 1000 for t in res.tests)


IGNORE_SIGNALS_AND_SLEEP = ("import signal, time\n"
                            "for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT):\n"
                            "    signal.signal(s, signal.SIG_IGN)\n")


@pytest.mark.parametrize("mode", ["assert", "stdio", "pytest"])
def test_ignoring_signals_does_not_turn_a_timeout_into_anything_else(sb, mode):
    if mode == "stdio":
        code, tests = IGNORE_SIGNALS_AND_SLEEP + "time.sleep(30)\nprint(3)\n", [
            {"input": "", "output": "3"}]
    else:
        code = IGNORE_SIGNALS_AND_SLEEP + "def add(a, b):\n    time.sleep(30)\n    return a + b\n"
        tests = suite_for(mode)
    res = verify(code, tests, mode, sandbox=sb, per_test_timeout=0.5, total_timeout=20)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests
    assert [t.status for t in res.tests] == ["timeout"], res.tests
    # cut by its own 0.5 s (0.5 s idle, pytest 1.7 s), not by the total's 20 s; was < 3 of a
    # total 5 s, too close to pytest mode's time on a loaded machine
    assert res.exec_result is not None and res.exec_result.duration < 10


def test_a_snapshot_of_files_the_code_made_unreadable_does_not_raise(sb):
    # A snapshot that raises reads as a sandbox failure to the code that asked for it (a
    # verifier forking the episode's final files): the code must not be able to cause one.
    code = ("import os\n"
            "open('kept', 'w').write('ok')\n"
            "open('hidden', 'w').write('x')\n"
            "os.chmod('hidden', 0)\n"
            "os.makedirs('closed/sub')\n"
            "os.chmod('closed', 0)\n")
    assert sb.run(code, session=False).ok
    snap = sb.snapshot()
    sb.reset()
    sb.restore(snap)
    assert sb.run("print(open('kept').read())", session=False).stdout == "ok\n"


# --- the candidate's process cannot read the tests -------------------------------------------

READS_ANSWERS = {
    # the solution process used to be a fork of the judge, which holds every test of the sample
    "assert": ("import gc, re\n"
               "def add(a, b):\n"
               "    for o in gc.get_objects():\n"
               "        if type(o) is dict and type(o.get('tests')) is list and 'mode' in o:\n"
               "            for t in o['tests']:\n"
               "                m = re.search(r'add\\(%d, %d\\) == (\\d+)' % (a, b), str(t))\n"
               "                if m:\n"
               "                    return int(m.group(1))\n"),
    # the program used to run in a fork of the runner, which holds every case and its output
    "stdio": ("import gc, sys\n"
              "data = sys.stdin.read()\n"
              "for o in gc.get_objects():\n"
              "    if type(o) is dict and o.get('mode') == 'stdio':\n"
              "        print(next(c['output'] for c in o['tests'] if c['input'] == data))\n"),
    # the test module used to be a file the candidate (same uid) can read
    "pytest": ("import glob, re\n"
               "def add(a, b):\n"
               "    for path in glob.glob('/tmp/agentgym-verify-*/test_solution.py'):\n"
               "        m = re.search(r'add\\(%d, %d\\) == (\\d+)' % (a, b), open(path).read())\n"
               "        if m:\n"
               "            return int(m.group(1))\n"),
}


def answers_suite(mode: str):
    """Expected values no correct `add` gives: only a lookup of the tests passes them."""
    if mode == "stdio":
        return [{"input": "1 2", "output": "17"}, {"input": "5 5", "output": "99"}]
    if mode == "assert":
        return ["assert add(1, 2) == 17", "assert add(5, 5) == 99"]
    return ("from solution import add\n\ndef test_a():\n    assert add(1, 2) == 17\n\n"
            "def test_b():\n    assert add(5, 5) == 99\n")


@pytest.mark.parametrize("mode", ["assert", "stdio", "pytest"])
def test_the_candidate_cannot_read_the_expected_answers(sb, mode):
    # The candidate's processes come from a factory that never held a test (a fresh
    # interpreter per sample), and the pytest module is a memfd of the judge.
    res = verify(READS_ANSWERS[mode], answers_suite(mode), mode, sandbox=sb)
    assert (res.reward, res.infra_error) == (0.0, None), res.tests


# Everything the candidate (same uid) could read the tests from: its own memory, byte by byte
# (gc finds objects only), the /proc files of every other process (its parent, the judge,
# the runner, the code server) and every file in the places it can write. The needle is a
# regex, so that the probe's own source and memory do not match it.
PROBE = r"""
import ctypes, os, re
NEEDLE = re.compile(rb"98765432[1]")

def probe():
    found = []
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable, so that it can read its own memory
    mem = open("/proc/self/mem", "rb", 0)
    for line in open("/proc/self/maps").read().splitlines():
        span, perms = line.split()[:2]
        if "r" not in perms or "[vvar" in line or "[vsyscall" in line:
            continue
        low, high = (int(x, 16) for x in span.split("-"))
        try:
            mem.seek(low)
            if NEEDLE.search(mem.read(high - low)):
                found.append("own memory " + line)
        except (OSError, ValueError, OverflowError):
            continue
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        for name in ("mem", "environ", "maps", "fd", "fdinfo", "cwd", "root"):
            path = f"/proc/{pid}/{name}"
            try:
                if name in ("mem", "environ", "maps"):
                    with open(path, "rb") as fh:
                        fh.read(1)
                else:
                    os.listdir(path)
                found.append(path)
            except OSError:
                pass
    for root in ("/tmp", "/work", "/dev/shm", os.path.expanduser("~")):
        for folder, _, files in os.walk(root):
            for name in files:
                try:
                    with open(os.path.join(folder, name), "rb") as fh:
                        if NEEDLE.search(fh.read()):
                            found.append(os.path.join(folder, name))
                except OSError:
                    pass
    return found
"""
PROBES = {
    "assert": (PROBE + "def add(a, b):\n    return probe()\n",
               ["found = add(1, 2)\nassert found == 987654321, found"]),
    "stdio": (PROBE + "print(probe())\n", [{"input": "1 2", "output": "987654321"}]),
    "pytest": (PROBE + "def add(a, b):\n    return probe()\n",
               "from solution import add\n\ndef test_a():\n"
               "    found = add(1, 2)\n    assert found == 987654321, found\n"),
}


@pytest.mark.parametrize("mode", ["assert", "stdio", "pytest"])
def test_the_candidate_cannot_read_the_judge_through_proc_or_its_own_memory(sb, mode):
    # /proc/<ppid>/mem, the judge's fds (the pytest module's memfd), environ, maps: every
    # process of the harness is non-dumpable, and the factory is the candidate's parent.
    code, tests = PROBES[mode]
    res = verify(code, tests, mode, sandbox=sb, per_test_timeout=20, total_timeout=40)
    assert (res.reward, res.infra_error) == (0.0, None), res.tests
    (test,) = res.tests
    assert test.message in ("AssertionError: []", "wrong output: '[]\\n'") or (
        test.message.startswith("AssertionError: []\nassert [] == 987654321")), test.message

"""verify: assert / stdio / pytest modes, partial credit, timeouts, infra errors."""

from __future__ import annotations

import json

import pytest

from agentgym._errors import ConfigError
from agentgym.sandboxes import DockerSandbox, averify, verify
from agentgym.sandboxes._verify import MARKER

pytestmark = pytest.mark.docker

ADD = "def add(a, b):\n    return a + b\n"


def test_assert_mode_fraction_and_all(sb):
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(0, 0) == 0"]
    res = verify(ADD, tests, sandbox=sb)
    assert [t.status for t in res.tests] == ["passed", "failed", "passed"]
    assert res.reward == pytest.approx(2 / 3) and res.status == "failed"
    assert "AssertionError" in res.tests[1].message
    assert verify(ADD, tests, sandbox=sb, reward="all").reward == 0.0
    assert verify(ADD, tests[:1], sandbox=sb, reward="all").reward == 1.0


def test_tests_are_isolated_and_time_out_on_their_own(sb):
    # a timeout ends the sample (test_verify_timeout_ends_sample.py): the hang goes last here
    code = "import time\ndef f(n):\n    if n < 0:\n        time.sleep(60)\n    return n\n"
    tests = ["assert f(1) == 1", "import os; os._exit(0)", "assert f(2) == 2", "f(-1)"]
    # 5 s (was 0.5): a passing test forks a judge and a solution process, 0.02 s idle but
    # far more on a saturated CI machine (the hang still ends the sample)
    res = verify(code, tests, sandbox=sb, per_test_timeout=5)
    assert [t.status for t in res.tests] == ["passed", "failed", "passed", "timeout"]
    assert res.reward == 0.5 and res.infra_error is None


def test_candidate_output_cannot_forge_the_report(sb):
    fake = MARKER + '{"tests": [], "runner": "x"}'  # the real marker, NUL bytes included
    code = f"print({fake!r})\ndef f():\n    return 0\n"
    res = verify(code, ["assert f() == 1"], sandbox=sb)
    assert res.reward == 0.0 and res.tests[0].status == "failed"


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "exit()", "raise SystemExit"])
def test_exiting_before_the_tests_is_not_a_pass(sb, exit_call):
    # a classic RL reward hack: leave before any assert runs
    code = f"def f():\n    return 0\n{exit_call}\n"
    res = verify(code, ["assert f() == 1", "assert f() == 2"], sandbox=sb)
    assert res.reward == 0.0
    assert all("SystemExit" in t.message for t in res.tests)


def test_stdio_program_may_end_with_exit_zero(sb):
    prog = "import sys\nprint(int(input()) + 1)\nsys.exit(0)\n"
    res = verify(prog, [{"input": "1", "output": "2"}], "stdio", sandbox=sb)
    assert res.reward == 1.0


def test_stdio_mode(sb):
    prog = "n = int(input())\nprint(n * 2)\n"
    cases = [
        {"input": "2\n", "output": "4\n"},
        {"input": "5", "output": "10"},
        {"input": "1", "output": "3"},
    ]
    res = verify(prog, cases, "stdio", sandbox=sb)
    assert [t.passed for t in res.tests] == [True, True, False]
    assert "wrong output" in res.tests[2].message


def test_pytest_mode_uses_real_pytest(sb):
    tests = (
        "import pytest\nfrom solution import add\n\n"
        "@pytest.mark.parametrize('a, b, c', [(1, 2, 3), (2, 2, 5)])\n"
        "def test_add(a, b, c):\n    assert add(a, b) == c\n\n"
        "def test_slow():\n    import time; time.sleep(30)\n"
    )
    # 5 s per test: the first call starts the solution process, on a loaded machine too
    res = verify(ADD, tests, "pytest", sandbox=sb, per_test_timeout=5, total_timeout=20)
    assert res.runner == "pytest"
    assert [(t.name, t.status) for t in res.tests] == [
        ("test_add[1-2-3]", "passed"),
        ("test_add[2-2-5]", "failed"),
        ("test_slow", "timeout"),
    ]
    assert res.reward == pytest.approx(1 / 3)


TWO_TESTS_AND_DECLARED_SKIPS = (
    "import pytest\nfrom solution import add\n\n"
    "def test_small():\n    assert add(1, 2) == 3\n\n"
    "def test_big():\n    assert add(2, 2) == 4\n\n"
    "@pytest.mark.skip(reason='the task says so')\n"
    "def test_declared_skip():\n    assert False\n\n"
    "@pytest.mark.xfail(reason='a known bug')\n"
    "def test_declared_xfail():\n    assert False\n"
)

# Code that cannot solve the big case makes it vanish instead of failing it.
DESELECT_TEST_BIG = """
import gc
from _pytest.config import Config

class Hide:
    def pytest_collection_modifyitems(self, items, config):
        hidden = [item for item in items if item.name == "test_big"]
        items[:] = [item for item in items if item not in hidden]
        config.hook.pytest_deselected(items=hidden)

for obj in gc.get_objects():
    if isinstance(obj, Config):
        obj.pluginmanager.register(Hide())
"""


@pytest.mark.parametrize("dodge", ["skip", "xfail", "deselect"])
def test_skips_the_task_did_not_declare_are_failures(sb, dodge):
    # the code cannot add numbers over 1 and tries to take test_big out of the score instead
    body = f"import pytest; pytest.{dodge}('too hard')" if dodge != "deselect" else "return 0"
    code = (DESELECT_TEST_BIG if dodge == "deselect" else "") + (
        f"def add(a, b):\n    if a > 1:\n        {body}\n    return a + b\n"
    )
    res = verify(code, TWO_TESTS_AND_DECLARED_SKIPS, "pytest", sandbox=sb, reward="all")
    assert {t.name: t.status for t in res.tests} == {
        "test_small": "passed",
        "test_big": "failed",
        "test_declared_skip": "skipped",
        "test_declared_xfail": "skipped",
    }, res.tests
    assert (res.reward, res.status) == (0.0, "failed")
    res = verify(code, TWO_TESTS_AND_DECLARED_SKIPS, "pytest", sandbox=sb)
    assert res.reward == 0.5


def test_killing_its_parent_process_is_the_codes_failure_not_infra(sb):
    # its parent is the factory of the candidate's processes (the runner before): killing it
    # ends the code's own process, and a wrong answer stays a failure, never infra_error
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + WRONG_ADD
    res = verify(code, ["assert add(1, 1) == 2"], sandbox=sb)
    assert res.status == "failed" and res.reward == 0.0 and res.infra_error is None
    assert verify(ADD, ["assert add(1, 1) == 2"], sandbox=sb).reward == 1.0  # a new factory


def test_infra_error_gives_no_reward(docker_ready):
    with DockerSandbox() as sb:
        sb._client.containers.get(sb.container_id).remove(force=True)
        res = verify(ADD, ["assert add(1, 1) == 2"], sandbox=sb)
        assert res.status == "infra_error" and res.reward is None and res.infra_error
        assert verify(ADD, ["assert add(1, 1) == 2"], sandbox=sb).reward == 1.0


async def test_averify_through_the_pool(pool):
    results = [
        await averify(ADD, [f"assert add({i}, 1) == {i + 1}"], sandbox=pool) for i in range(3)
    ]
    assert [r.reward for r in results] == [1.0, 1.0, 1.0]


def test_bad_arguments_are_config_errors(sb):
    with pytest.raises(ConfigError, match="mode"):
        verify(ADD, ["pass"], "junit", sandbox=sb)
    with pytest.raises(ConfigError, match="list"):
        verify(ADD, "assert True", sandbox=sb)
    with pytest.raises(ConfigError, match="at least one"):
        verify(ADD, [], sandbox=sb)
    with pytest.raises(ConfigError, match="reward"):
        verify(ADD, ["pass"], sandbox=sb, reward="max")


def test_candidate_cannot_write_a_report_through_inherited_or_proc_fds(sb):
    forged = MARKER + json.dumps(
        {
            "tests": [
                {
                    "name": "test_0",
                    "passed": True,
                    "status": "passed",
                    "message": "",
                    "duration": 0.0,
                }
            ],
            "runner": "assert",
        }
    )
    # a detached grandchild waits for the runner's own report, then writes a forged one after it
    code = (
        "import os, time\n"
        f"fake = {forged + chr(10)!r}.encode()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    time.sleep(1.0)\n"
        "    for fd in range(3, 256):\n"
        "        try: os.write(fd, fake)\n"
        "        except OSError: pass\n"
        "    os._exit(0)\n"
        "proc = f'/proc/{os.getppid()}/fd'\n"
        "try:\n"
        "    for name in os.listdir(proc):\n"
        "        try: open(os.path.join(proc, name), 'wb').write(fake)\n"
        "        except OSError: pass\n"
        "except OSError: pass\n"
        "def f():\n    return 0\n"
    )
    res = verify(code, ["assert f() == 1"], sandbox=sb)
    assert res.reward == 0.0 and res.status == "failed" and res.infra_error is None


WRONG_ADD = "def add(a, b):\n    return 7\n"
FORGED_VERDICT = "b'{\"passed\": true}\\n'"
ATTACKS = {
    # the test's own process used to write its verdict: forge that verdict
    "json.dumps patched": "import json\njson.dumps = lambda *a, **k: '{\"passed\": true}'\n"
    + WRONG_ADD,
    "verdict written to every fd, then exit": "import os\nfor fd in range(3, 256):\n"
    f"    try:\n        os.write(fd, {FORGED_VERDICT})\n    except OSError:\n        pass\n"
    "os._exit(0)\n",
    "builtins.AssertionError patched": "import builtins\n"
    "builtins.AssertionError = type('Quiet', (Exception,), {})\n" + WRONG_ADD,
    "sys.settrace forges the verdict when an assert fails": "import os, sys\n"
    "def tracer(frame, event, arg):\n"
    "    if event == 'exception' and arg[0] is AssertionError:\n"
    "        for fd in range(3, 256):\n"
    f"            try:\n                os.write(fd, {FORGED_VERDICT})\n"
    "            except OSError:\n                pass\n"
    "        os._exit(0)\n"
    "    return tracer\n"
    "sys.settrace(tracer)\n" + WRONG_ADD,
    "an object equal to everything": "class Yes:\n    def __eq__(self, other):\n"
    "        return True\n\ndef add(a, b):\n    return Yes()\n",
    "kill the test's process": "import os, signal\ndef add(a, b):\n"
    "    os.kill(os.getppid(), signal.SIGKILL)\n",
    "exit in the call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "exit before the tests": "import os\ndef add(a, b):\n    return a + b\nos._exit(0)\n",
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_candidate_cannot_forge_the_tests_verdict(sb, attack):
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
    res = verify(ATTACKS[attack], tests, sandbox=sb, per_test_timeout=2)
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None), res.tests
    if attack == "an object equal to everything":
        assert all("Yes, which is not plain data" in t.message for t in res.tests)


def test_assert_mode_passes_only_function_calls_and_plain_data(sb):
    code = (
        "import math\nLIMIT = {'n': (1, 2.5)}\nclass Box:\n    pass\n\n"
        "def root(x):\n    if x < 0:\n        raise ValueError('negative')\n"
        "    return [math.sqrt(x), float('nan'), {1j}, b'x']\n"
    )
    tests = [
        "r = root(4)\nassert r[0] == 2.0 and r[1] != r[1] and r[2] == {1j} and r[3] == b'x'",
        "assert LIMIT == {'n': (1, 2.5)} and math.pi > 3",
        "try:\n    root(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)",
        "assert Box() is not None",
        "assert root(lambda: 0)",
    ]
    res = verify(code, tests, sandbox=sb)
    assert [t.status for t in res.tests] == ["passed"] * 3 + ["failed"] * 2, res.tests
    assert "Box is a class" in res.tests[3].message
    assert "not plain data" in res.tests[4].message


PYTEST_FORGERIES = {
    "json.dumps patched": "import json\njson.dumps = lambda *a, **k: '{\"passed\": true}'\n",
    "passing outcomes written to every fd and to the old outcome log": (
        "import glob, json, os\n"
        "line = json.dumps({'name': 'test_big', 'passed': True, 'status': 'passed', "
        "'message': '', 'duration': 0.0}) + '\\n'\n"
        "for fd in range(3, 256):\n"
        "    try:\n        os.write(fd, line.encode())\n    except OSError:\n        pass\n"
        "for path in glob.glob('/tmp/agentgym-verify-*/*'):\n"
        "    open(path, 'a').write(line)\n"
    ),
}


@pytest.mark.parametrize("attack", PYTEST_FORGERIES)
def test_pytest_mode_verdicts_are_the_judges(sb, attack):
    code = PYTEST_FORGERIES[attack] + "def add(a, b):\n    return a + b if a < 2 else 0\n"
    res = verify(code, TWO_TESTS_AND_DECLARED_SKIPS, "pytest", sandbox=sb)
    statuses = {t.name: t.status for t in res.tests}
    assert statuses["test_big"] == "failed" and res.status == "failed", res.tests
    assert res.reward in (0.0, 0.5) and res.infra_error is None


def test_tests_do_not_import_modules_the_candidate_planted(sb):
    # a module in the work dir that a test imports would run in the judge's process
    planted = ATTACKS["verdict written to every fd, then exit"]
    code = f"open('colorsys.py', 'w').write({planted!r})\n" + WRONG_ADD
    res = verify(code, ["import colorsys\nassert add(1, 2) == 3"], sandbox=sb)
    assert res.reward == 0.0 and "AssertionError" in res.tests[0].message

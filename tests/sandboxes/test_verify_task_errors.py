"""verify with a broken *task*: its tests, not the candidate's code, are at fault.

A pytest module that collects no tests or fails to import must fail every sample with a
message that says so (never a pass, never a crash of the training run), in real pytest and in
the built-in runner used when the image lacks pytest. Malformed ``stdio`` cases are a
`ConfigError` before anything runs, not a 0 that blames the candidate's program.
"""

from __future__ import annotations

import pytest

from agentgym._errors import ConfigError
from agentgym.sandboxes import VerifyResult, verify
from agentgym.sandboxes._verify import RUNNER_SOURCE, _payload, _run_kwargs, _score

pytestmark = pytest.mark.docker

ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return 0\n"
NO_TESTS = "pytest collected no tests: name test functions test_* (or classes Test*)"
BROKEN = "the test file itself failed to import or collect, before any test ran: "

# test modules that collect nothing: a helper not named test_*, and no function at all
WITHOUT_TESTS = {
    "check_not_test": "from solution import add\ndef check_add():\n    assert add(1, 2) == 3\n",
    "only_a_value": "x = 1\n",
}
# test modules that cannot be imported, and pytest's line that says why
UNIMPORTABLE = {
    "syntax_error": (
        "from solution import add\ndef test_add(:\n    assert add(1, 2) == 3\n",
        "SyntaxError: invalid syntax (line 2)",
    ),
    "missing_module": (
        "import no_such_module_xyz\nfrom solution import add\n"
        "def test_add():\n    assert add(1, 2) == 3\n",
        "ModuleNotFoundError: No module named 'no_such_module_xyz'",
    ),
    "raises": (
        "raise ValueError('the task is broken')\ndef test_add():\n    pass\n",
        "ValueError: the task is broken",
    ),
}


def only_failure(res: VerifyResult) -> tuple[str, str]:
    """(name, message) of the sample's one failed test; asserts the sample scored 0."""
    assert (res.status, res.reward, res.infra_error) == ("failed", 0.0, None), res
    assert [t.status for t in res.tests] == ["failed"], res.tests
    return res.tests[0].name, res.tests[0].message


@pytest.mark.parametrize("tests", WITHOUT_TESTS.values(), ids=WITHOUT_TESTS.keys())
def test_pytest_module_without_tests_fails_the_sample(sb, tests):
    for reward in ("fraction", "all"):
        res = verify(ADD, tests, "pytest", sandbox=sb, reward=reward)
        assert res.runner == "pytest"
        assert only_failure(res) == ("test_solution.py", NO_TESTS)


@pytest.mark.parametrize("tests, error", UNIMPORTABLE.values(), ids=UNIMPORTABLE.keys())
def test_pytest_module_that_fails_to_import_blames_the_test_file(sb, tests, error):
    # the same verdict for right and wrong code: the test file failed, not the candidate
    for code in (ADD, WRONG_ADD):
        res = verify(code, tests, "pytest", sandbox=sb)
        assert only_failure(res) == ("collecting test_solution.py", BROKEN + error)


def test_pytest_module_that_skips_itself_still_fails(sb):
    tests = "import pytest\npytest.skip('not today', allow_module_level=True)\n"
    name, message = only_failure(verify(ADD, tests, "pytest", sandbox=sb))
    assert name == "collecting test_solution.py" and "not today" in message


def verify_builtin(sb, code: str, tests: str) -> VerifyResult:
    """`verify` in pytest mode as in an image without pytest: the built-in runner's verdict.

    ``sys.modules["pytest"] = None`` makes the runner's ``import pytest`` fail in the real
    sandbox, so the fallback runs on the same image.
    """
    source = "import sys\nsys.modules['pytest'] = None\n" + RUNNER_SOURCE
    payload = _payload(code, tests, "pytest", 5.0, 30.0, "fraction")
    return _score(sb.run(source, **_run_kwargs(sb, payload, 30.0)), "fraction")


def test_builtin_runner_runs_top_level_test_functions(sb):
    # the control for the two below: the helper really reaches the built-in runner
    tests = "from solution import add\ndef test_add():\n    assert add(1, 2) == 3\n"
    res = verify_builtin(sb, ADD, tests)
    assert (res.runner, res.reward, [t.name for t in res.tests]) == ("builtin", 1.0, ["test_add"])


@pytest.mark.parametrize("tests", WITHOUT_TESTS.values(), ids=WITHOUT_TESTS.keys())
def test_builtin_runner_fails_a_module_without_tests(sb, tests):
    res = verify_builtin(sb, ADD, tests)
    name, message = only_failure(res)
    assert (res.runner, name) == ("builtin", "test_solution.py")
    assert message.startswith("the test file has no top-level test_* function")


def test_builtin_runner_fails_a_test_file_with_a_syntax_error(sb):
    res = verify_builtin(sb, ADD, UNIMPORTABLE["syntax_error"][0])
    name, message = only_failure(res)
    assert (res.runner, name) == ("builtin", "collecting test_solution.py")
    assert message == BROKEN + "SyntaxError: invalid syntax (test_solution.py, line 2)"


MALFORMED_STDIO = {
    "stdin_stdout_keys": (
        [{"stdin": "3", "stdout": "6"}],
        "stdio test 0: 'input' is missing (keys ['stdin', 'stdout'])",
    ),
    "output_not_str": ([{"input": "3", "output": 6}], "stdio test 0: 'output' is int, not str"),
    "no_output": (
        [{"input": "1", "output": "2"}, {"input": "3"}],
        "stdio test 1: 'output' is missing",
    ),
    "case_not_mapping": ([{"input": "1", "output": "2"}, "3 6"], "stdio test 1 is str"),
    "one_case_not_a_list": ({"input": "3", "output": "6"}, "wrap it in a list"),
}


@pytest.mark.parametrize("tests, match", MALFORMED_STDIO.values(), ids=MALFORMED_STDIO.keys())
def test_malformed_stdio_tests_are_config_errors_before_anything_runs(tests, match):
    # not a sandbox at all: the error must come before any run (or sandbox check)
    with pytest.raises(ConfigError) as err:
        verify("print(int(input()) * 2)\n", tests, "stdio", sandbox=object())  # type: ignore[arg-type]
    assert match in str(err.value) and '{"input": str, "output": str}' in str(err.value)
    assert "\n" not in str(err.value)


def test_stdio_cases_may_carry_other_keys_and_empty_input(sb):
    cases = [{"input": "3", "output": "6", "note": object()}, {"input": "", "output": "none"}]
    prog = "import sys\ndata = sys.stdin.read()\nprint(int(data) * 2 if data else 'none')\n"
    res = verify(prog, cases, "stdio", sandbox=sb)
    assert (res.reward, [t.passed for t in res.tests]) == (1.0, [True, True])

"""A test that times out ends its sample, and the judge imports no module the candidate names.

Found by a red-team probe playing the policy: (1) code that hangs on every input made a
sample of N stdio cases last N x ``per_test_timeout`` (pythoncode sets ``total_timeout`` to
that), so a 30-case task outlived the trainer's 300 s episode deadline and the episode was
dropped as late instead of scored 0; (2) a candidate's fake module named ``unittest.__main__``
made the judge import it, which ran unittest inside the judge (it could collect a
``test*.py`` the candidate wrote).
"""

from __future__ import annotations

import time

import pytest

from agentgym.sandboxes import verify

pytestmark = pytest.mark.docker

PER_TEST_S = 1.0
HANGS = "import time\ndef f(n):\n    time.sleep(60)\n"
HANGS_PROGRAM = "import time\ntime.sleep(60)\n"
CASES = 12  # hung one after another, 12 s; ended at the first, about 1 s


@pytest.mark.parametrize(("mode", "code", "tests", "prefix"), [
    ("assert", HANGS, [f"assert f({i}) == {i}" for i in range(CASES)], "test"),
    ("stdio", HANGS_PROGRAM, [{"input": str(i), "output": str(i)} for i in range(CASES)], "case"),
], ids=["assert", "stdio"])
def test_a_hang_ends_the_sample_at_its_first_timeout(sb, mode, code, tests, prefix):
    started = time.monotonic()
    res = verify(code, tests, mode, sandbox=sb, per_test_timeout=PER_TEST_S,
                 total_timeout=PER_TEST_S * CASES + 10)
    elapsed = time.monotonic() - started
    assert elapsed < PER_TEST_S + 4.0, (elapsed, res.tests)  # not CASES x PER_TEST_S
    assert [t.status for t in res.tests] == ["timeout"] * CASES
    assert "timed out" in res.tests[0].message and "not run" not in res.tests[0].message
    for later in res.tests[1:]:
        assert later.message == f"not run: {prefix}_0 timed out, and a timeout ends the " \
                                "sample's tests", later
        assert later.duration == 0.0
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None)


@pytest.mark.parametrize("reward", ["fraction", "all"])
def test_tests_before_a_timeout_keep_their_verdicts(sb, reward):
    code = "import time\ndef f(n):\n    if n == 1:\n        time.sleep(60)\n    return n\n"
    tests = ["assert f(0) == 0", "assert f(2) == 3", "assert f(1) == 1", "assert f(3) == 3"]
    # 5 s: the tests before the hang must finish in time on a saturated machine too
    res = verify(code, tests, "assert", sandbox=sb, per_test_timeout=5.0,
                 total_timeout=30.0, reward=reward)
    assert [t.status for t in res.tests] == ["passed", "failed", "timeout", "timeout"]
    assert "not run: test_2 timed out" in res.tests[3].message
    assert res.reward == pytest.approx(0.25 if reward == "fraction" else 0.0)


def test_a_fake_main_module_is_not_imported_by_the_judge(sb):
    code = ("import types\n"
            "_judge_imports_this = types.ModuleType('unittest.__main__')\n"
            "_and_this = types.ModuleType('this')\n"
            "def f(n):\n    return n\n")
    res = verify(code, ["assert f(1) == 1", "assert f(2) == 2"], "assert", sandbox=sb,
                 per_test_timeout=10.0, total_timeout=30.0)
    # before: unittest.__main__ ran in the judge and ended it ("SystemExit(True) before ...")
    assert [t.status for t in res.tests] == ["passed", "passed"], res.tests
    assert res.reward == 1.0

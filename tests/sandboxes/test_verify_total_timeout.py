"""verify's total_timeout: the sample stops on time and keeps what finished, in every mode.

Each sample below needs more than its ``total_timeout``: two quick tests (one passes, one
fails), a slow one that passes within the budget, one that hangs (cut by the total deadline,
not by its own ``per_test_timeout``), then another hang and a quick test that the runner must
not start any more (duration 0).
Before the fix, a judge forked after the deadline escaped its kill and the runner waited for
the hang, so the host killed the whole call at ``total_timeout + RUNNER_SLACK_S`` and every
result was lost.
"""

from __future__ import annotations

import time

import pytest

from agentgym.sandboxes import verify
from agentgym.sandboxes._verify import RUNNER_SLACK_S

pytestmark = pytest.mark.docker

# The slow test (1 s) ends well inside it, and the hang starts before it runs out, on a
# saturated machine too: the clock also runs while pytest mode imports pytest (3 s was tight).
TOTAL_S = 5.0
PER_TEST_S = 20.0  # longer than the sample: only the total deadline can cut the hang
MARGIN_S = 3.0  # start-up and clean-up; below RUNNER_SLACK_S, so the outer kill fails it
assert MARGIN_S < RUNNER_SLACK_S

FUNC = ("import time\n"
        "def f(n):\n"
        "    if n < 0:\n"
        "        time.sleep(60)\n"
        "    if n == 0:\n"
        "        time.sleep(1)\n"
        "    return n\n")
PROGRAM = "import time\nn = int(input())\n" + FUNC.split("\n", 1)[1] + "print(f(n))\n"
SNIPPETS = ["assert f(1) == 1", "assert f(1) == 2", "assert f(0) == 0", "assert f(-1) == -1",
            "assert f(-2) == -2", "assert f(2) == 2"]
PYTEST_NAMES = ["test_quick_pass", "test_quick_fail", "test_slow_pass", "test_hang",
                "test_hang_never_started", "test_quick_never_started"]
SAMPLES = {
    "assert": (FUNC, SNIPPETS, [f"test_{i}" for i in range(6)]),
    "stdio": (PROGRAM, [{"input": "1", "output": "1"}, {"input": "1", "output": "2"},
                        {"input": "0", "output": "0"}, {"input": "-1", "output": "-1"},
                        {"input": "-2", "output": "-2"}, {"input": "2", "output": "2"}],
              [f"case_{i}" for i in range(6)]),
    "pytest": (FUNC, "from solution import f\n" + "".join(
        f"\n\ndef {name}():\n    {snippet}\n" for name, snippet in zip(PYTEST_NAMES, SNIPPETS)),
        PYTEST_NAMES),
}
EXPECTED = ["passed", "failed", "passed", "timeout", "timeout", "timeout"]


def _timed_verify(sb, mode, reward="fraction"):
    code, tests, _ = SAMPLES[mode]
    started = time.monotonic()
    res = verify(code, tests, mode, sandbox=sb, per_test_timeout=PER_TEST_S,
                 total_timeout=TOTAL_S, reward=reward)
    return res, time.monotonic() - started


@pytest.mark.parametrize("mode", ["assert", "stdio", "pytest"])
def test_the_total_timeout_cuts_the_sample_and_keeps_what_finished(sb, mode):
    res, elapsed = _timed_verify(sb, mode)
    assert elapsed < TOTAL_S + MARGIN_S, (elapsed, res.tests)
    assert [(t.name, t.status) for t in res.tests] == list(zip(SAMPLES[mode][2], EXPECTED))
    assert res.runner == mode
    quick_fail = res.tests[1]
    assert quick_fail.message and "total_timeout" not in quick_fail.message
    assert res.tests[2].duration >= 1.0  # it really ran to its end
    for cut in res.tests[3:]:
        assert "total_timeout" in cut.message and "ran out" in cut.message, cut
    assert [t.duration for t in res.tests[4:]] == [0.0, 0.0], res.tests  # never started
    assert (res.reward, res.status, res.infra_error) == (pytest.approx(2 / 6), "failed", None)


def test_under_reward_all_a_cut_sample_scores_zero(sb):
    res, elapsed = _timed_verify(sb, "assert", reward="all")
    assert elapsed < TOTAL_S + MARGIN_S, (elapsed, res.tests)
    assert [t.status for t in res.tests] == EXPECTED
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None)


FLOOD_AFTER_ANSWER = ("import os, sys\n"
                      "if os.fork() == 0:\n"
                      "    while True:\n"
                      "        sys.stdout.write('x' * 4096)\n"
                      "print(input())\n")


def test_a_stdio_program_that_floods_stdout_after_its_answer_still_gets_a_report(sb):
    # The runner read the pipe until it went quiet, which a forked writer never lets happen:
    # it grew without bound (the sandbox's OOM kill took the report with it).
    cases = [{"input": "1", "output": "1"}, {"input": "2", "output": "2"}]
    res = verify(FLOOD_AFTER_ANSWER, cases, "stdio", sandbox=sb, per_test_timeout=2,
                 total_timeout=TOTAL_S)
    assert [(t.name, t.status) for t in res.tests] == [("case_0", "failed"), ("case_1", "failed")]
    # which limit the flood hits first (the cap while the program runs, or the wrong answer
    # read after it reported) depends on scheduling; either way the case fails on its output
    assert all(t.message == "output limit exceeded"
               or (t.message.startswith("wrong output: ") and "xxxx" in t.message)
               for t in res.tests), res.tests
    assert (res.reward, res.status, res.infra_error) == (0.0, "failed", None)

"""Pure pieces of the sandbox package, no Docker: pool arguments, report scoring, owner checks
and file paths."""

from __future__ import annotations

import json
import os
import socket

import pytest

from agentgym._errors import ConfigError
from agentgym.sandboxes import ExecResult, ExecStatus, SandboxPool, _reap
from agentgym.sandboxes._protocol import check_relative
from agentgym.sandboxes._verify import MARKER, _score


def test_pool_rejects_bad_sizes():
    with pytest.raises(ConfigError):
        SandboxPool(size=0)


def _ran(stdout: str, status: ExecStatus = ExecStatus.OK) -> ExecResult:
    return ExecResult(stdout, "", 0, 0.1, status)


def _report(*passed: bool) -> str:
    tests = [{"name": f"t{i}", "passed": p, "status": "passed" if p else "failed"}
             for i, p in enumerate(passed)]
    return MARKER + json.dumps({"tests": tests, "runner": "assert"})


def test_score_counts_the_runners_report():
    res = _score(_ran(_report(True, False) + "\n"), "fraction")
    assert (res.reward, res.status, res.runner) == (0.5, "failed", "assert")
    assert _score(_ran(_report(True, True)), "all").reward == 1.0


def test_score_takes_the_last_marker_line():
    # a line forged by the code during a test comes before the runner's own report
    res = _score(_ran(_report(True, True) + "\n" + _report(False, False)), "fraction")
    assert res.reward == 0.0 and [t.passed for t in res.tests] == [False, False]


@pytest.mark.parametrize("line", [MARKER + "{not json", MARKER + "[1, 2]",
                                  MARKER + '{"tests": [{"bogus": 1}], "runner": "x"}', ""])
def test_garbled_or_missing_report_is_a_failure_not_a_crash(line):
    res = _score(_ran(line), "fraction")
    assert res.status == "failed" and res.reward == 0.0 and res.infra_error is None
    assert res.tests[0].name == "runner" and "readable" in res.tests[0].message


def test_infra_error_is_not_a_zero():
    res = _score(ExecResult.infra_failure("daemon gone"), "fraction")
    assert (res.status, res.reward, res.infra_error) == ("infra_error", None, "daemon gone")


def _labels(pid: int, start: str | None) -> dict[str, str]:
    return {_reap.HOST: socket.gethostname(), _reap.OWNER: str(pid),
            _reap.OWNER_START: start if start is not None else ""}


def test_owner_alive_checks_pid_and_start_time():
    me = os.getpid()
    assert _reap.owner_alive(_labels(me, _reap.process_start_time(me)))
    assert _reap.owner_alive(_labels(me, "")), "an unknown start time must not reap a live owner"
    assert not _reap.owner_alive(_labels(me, "1")), "a recycled pid is not the owner"
    assert not _reap.owner_alive(_labels(0, ""))
    assert not _reap.owner_alive({**_labels(me, ""), _reap.OWNER: "x"})
    assert _reap.owner_alive({**_labels(0, ""), _reap.HOST: "another-host"})


@pytest.mark.parametrize("path", ["/etc/x", "../x", "a/../../x", ".", "a/.."])
def test_paths_leaving_the_work_dir_are_rejected(path):
    with pytest.raises(ConfigError, match="use a relative path"):
        check_relative(path)


@pytest.mark.parametrize("path", ["a.py", "src/main.py", "./a", "a/../b"])
def test_paths_inside_the_work_dir_are_accepted(path):
    check_relative(path)

"""Verification runner: runs inside the sandbox as one process per sample (standard library).

Reads ``{"code", "tests", "mode", "per_test_timeout", "total_timeout"}`` as JSON on stdin and
writes one line ``MARKER + JSON`` with per-test results to its original stdout. Each test runs
in its own forked child (new session, killed at its deadline), so a test that hangs, crashes
or exits cannot take the others with it. The candidate's output never reaches the runner's
stdout: in ``assert`` and ``pytest`` modes it goes to /dev/null, in ``stdio`` mode to a pipe
that the runner compares with the expected output.

``pytest`` mode writes the code to ``solution.py`` and the tests to ``test_solution.py`` in a
temp dir and runs real pytest with a plugin that logs per-test outcomes and sets a SIGALRM
per-test timeout; a skip, xfail or deselection the task did not declare counts as a failure.
If pytest is not importable in the image, a minimal built-in runner calls every top-level
``test_*`` function instead (no fixtures, no parametrize) and reports ``runner="builtin"``.
"""

import ast
import json
import os
import select
import signal
import sys
import tempfile
import time

MARKER = "\x00agentgym-verify\x00"
STATUSES = ("passed", "failed", "timeout", "skipped")
OUTPUT_CAP = 1 << 20


def _not_dumpable():
    """PR_SET_DUMPABLE 0: test children (same uid) cannot open this process's fds via /proc."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _child(body, stdin_data, out_w, res_w, exit_ok):
    """A test's process. It keeps fds 0-2 and ``res_w`` only.

    Why: the candidate runs here; it must reach neither the runner's report nor any other
    fd of the harness.
    """
    os.setsid()
    fd = os.memfd_create("stdin")
    os.write(fd, stdin_data)
    os.lseek(fd, 0, os.SEEK_SET)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(fd, 0)
    os.dup2(out_w if out_w is not None else null, 1)
    os.dup2(null, 2)
    os.closerange(3, res_w)
    os.closerange(res_w + 1, 1 << 16)
    result = {"passed": True}
    try:
        body()
    except SystemExit as exc:
        # A program may end with exit(0) (stdio mode); a test must run to its end, or
        # `sys.exit(0)` in the candidate would "pass" every test it skipped (a reward hack).
        if not exit_ok or exc.code not in (None, 0):
            result = {"passed": False,
                      "error": f"SystemExit({exc.code!r}) before the test finished"}
    except BaseException as exc:
        result = {"passed": False, "error": (f"{type(exc).__name__}: {exc}")[:1000]}
    try:
        sys.stdout.flush()
    except Exception:
        pass
    os.write(res_w, (json.dumps(result) + "\n").encode())
    os._exit(0)


def _isolated(body, stdin_data, timeout, capture, exit_ok=False):
    """Run ``body`` in a forked child; return (result dict, captured stdout, duration)."""
    res_r, res_w = os.pipe()
    out_r, out_w = os.pipe() if capture else (None, None)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(res_r)
        if out_r is not None:
            os.close(out_r)
        _child(body, stdin_data, out_w, res_w, exit_ok)
    os.close(res_w)
    if out_w is not None:
        os.close(out_w)
    result, out = _wait(res_r, out_r, started + timeout)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    os.waitpid(pid, 0)
    for fd in (res_r, out_r):
        if fd is not None:
            os.close(fd)
    return result, out, time.monotonic() - started


def _wait(res_r, out_r, deadline):
    buf, out = b"", bytearray()
    watch = [res_r] + ([out_r] if out_r is not None else [])
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return {"passed": False, "timeout": True, "error": "timed out"}, bytes(out)
        for fd in select.select(watch, [], [], remaining)[0]:
            data = os.read(fd, 65536)
            if fd == out_r:
                if not data:
                    watch.remove(fd)
                out += data
                if len(out) > OUTPUT_CAP:
                    return {"passed": False, "error": "output limit exceeded"}, bytes(out)
                continue
            if not data:
                return {"passed": False, "error": "the test process died"}, bytes(out)
            buf += data
            if buf.endswith(b"\n"):
                _drain(out_r, out, watch)
                return _parse_result(buf), bytes(out)


def _parse_result(buf):
    try:
        result = json.loads(buf)
    except ValueError:
        result = None
    if not isinstance(result, dict) or not isinstance(result.get("passed"), bool):
        return {"passed": False, "error": "the test process wrote a garbled result"}
    return result


def _drain(out_r, out, watch):
    while out_r in watch and select.select([out_r], [], [], 0.2)[0]:
        data = os.read(out_r, 65536)
        if not data:
            return
        out += data[:OUTPUT_CAP]


def _normalise(text):
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _record(name, result, duration, status=None):
    if status is None:
        status = ("passed" if result.get("passed") else
                  "timeout" if result.get("timeout") else "failed")
    return {"name": name, "passed": status == "passed", "status": status,
            "message": result.get("error", ""), "duration": duration}


def _deadline_for(req, total_deadline):
    return max(0.0, min(req["per_test_timeout"], total_deadline - time.monotonic()))


def run_assert(req, total_deadline):
    out = []
    for i, test in enumerate(req["tests"]):
        def body(test=test, i=i):
            g = {"__name__": "__main__"}
            exec(compile(req["code"], "solution.py", "exec"), g)
            exec(compile(test, f"test_{i}", "exec"), g)
        result, _, dur = _isolated(body, b"", _deadline_for(req, total_deadline), False)
        out.append(_record(f"test_{i}", result, dur))
    return out


def run_stdio(req, total_deadline):
    out = []
    for i, case in enumerate(req["tests"]):
        def body():
            exec(compile(req["code"], "solution.py", "exec"), {"__name__": "__main__"})
        data = case.get("input", "").encode()
        result, got, dur = _isolated(body, data, _deadline_for(req, total_deadline), True,
                                     exit_ok=True)
        if result.get("passed"):
            got_text = got.decode("utf-8", "replace")
            if _normalise(got_text) != _normalise(case.get("output", "")):
                result = {"passed": False, "error": f"wrong output: {got_text[:200]!r}"}
        out.append(_record(f"case_{i}", result, dur))
    return out


def _workspace(req):
    d = tempfile.mkdtemp(prefix="agentgym-verify-")
    with open(os.path.join(d, "solution.py"), "w") as fh:
        fh.write(req["code"])
    with open(os.path.join(d, "test_solution.py"), "w") as fh:
        fh.write(req["tests"] if isinstance(req["tests"], str) else "\n".join(req["tests"]))
    return d


def run_pytest(req, total_deadline):
    d = _workspace(req)
    try:
        import pytest  # noqa: F401
    except ImportError:
        return run_builtin_pytest(req, d, total_deadline), "builtin"
    log = os.path.join(d, "outcomes.jsonl")

    def body():
        os.chdir(d)
        sys.path.insert(0, d)
        import pytest
        rc = pytest.main([d, "-q", "-p", "no:cacheprovider"], plugins=[_outcomes_plugin(req, log)])
        if int(rc) not in (0, 1, 5):
            raise RuntimeError(f"pytest exit code {int(rc)}")
    result, _, dur = _isolated(body, b"", max(0.0, total_deadline - time.monotonic()), False)
    return _read_outcomes(log, result) or [_record("pytest", result, dur)], "pytest"


def _outcomes_plugin(req, log_path):
    """A pytest plugin that logs each collected test, then each test's outcome (JSON lines).

    A skip or xfail that no ``skip``/``skipif``/``xfail`` marker of the task declares is a
    failure: otherwise code could skip what it cannot solve and leave it out of the score.
    A module that fails or skips at collection is one failure. Tests collected but never
    reported (deselected, or the session stopped) fail when the runner reads the log.
    """
    import pytest

    log = open(log_path, "a")

    def write(obj):
        log.write(json.dumps(obj) + "\n")
        log.flush()

    class Outcomes:
        def __init__(self):
            self.running = {}

        def pytest_itemcollected(self, item):
            write({"collected": _test_name(item.nodeid)})

        def pytest_collectreport(self, report):
            if report.failed or report.skipped:
                write(_outcome("collecting " + (report.nodeid or "the tests"), "failed",
                               _why(report), report.duration or 0.0))

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item):
            def on_alarm(*_):
                raise TimeoutError("test exceeded {:g}s".format(req["per_test_timeout"]))
            old = signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, req["per_test_timeout"])
            try:
                yield
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            report = (yield).get_result()
            state = self.running.setdefault(
                item.nodeid, _outcome(_test_name(item.nodeid), "passed", "", 0.0))
            state["duration"] += report.duration or 0.0
            if state["status"] == "passed" and not report.passed:  # the first problem decides
                state.update(_judged(item, report))
            if report.when == "teardown":
                write(self.running.pop(item.nodeid))

    return Outcomes()


def _judged(item, report):
    """Status and message of a phase that did not pass."""
    why = _why(report)
    if report.failed:
        timeout = "TimeoutError: test exceeded" in report.longreprtext
        return {"status": "timeout" if timeout else "failed", "passed": False, "message": why}
    declared = any(True for name in ("skip", "skipif", "xfail") for _ in item.iter_markers(name))
    if declared:
        return {"status": "skipped", "passed": False, "message": why}
    how = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    return {"status": "failed", "passed": False,
            "message": f"{how} at run time ({why}); only a skip/skipif/xfail marker of the "
                       "task leaves a test out of the score"}


def _why(report):
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail)[:1000]
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return str(longrepr[2])[:1000]
    crash = getattr(longrepr, "reprcrash", None)
    return (crash.message if crash is not None else report.longreprtext)[:1000]


def _test_name(nodeid):
    return nodeid.split("::", 1)[-1]


def _outcome(name, status, message, duration):
    return {"name": name, "passed": status == "passed", "status": status,
            "message": message, "duration": duration}


def _read_outcomes(path, result):
    """Per-test records from the plugin's log, in collection order; unreported ones failed."""
    collected, reported = [], {}
    try:
        with open(path, "rb") as fh:
            lines = fh.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("collected"), str):
            if obj["collected"] not in collected:
                collected.append(obj["collected"])
        elif isinstance(obj, dict) and obj.get("status") in STATUSES:
            reported.setdefault(str(obj.get("name")), obj)
    status = "timeout" if result.get("timeout") else "failed"
    why = result.get("error") or "deselected, or never ran"
    out = [reported.pop(name, None) or _outcome(name, status, why, 0.0) for name in collected]
    out += list(reported.values())
    return [_outcome(str(r["name"]), r["status"], str(r.get("message", ""))[:1000],
                     float(r.get("duration") or 0.0)) for r in out]


def run_builtin_pytest(req, d, total_deadline):
    tree = ast.parse(req["tests"] if isinstance(req["tests"], str) else "\n".join(req["tests"]))
    names = [n.name for n in tree.body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    out = []
    for name in names:
        def body(name=name):
            os.chdir(d)
            sys.path.insert(0, d)
            g = {"__name__": "test_solution"}
            with open(os.path.join(d, "test_solution.py")) as fh:
                exec(compile(fh.read(), "test_solution.py", "exec"), g)
            g[name]()
        result, _, dur = _isolated(body, b"", _deadline_for(req, total_deadline), False)
        out.append(_record(name, result, dur))
    return out


def main():
    _not_dumpable()
    req = json.loads(sys.stdin.read())
    report = os.dup(1)  # the one trusted report goes here; every test child closes it
    total_deadline = time.monotonic() + req["total_timeout"]
    runner = req["mode"]
    if runner == "assert":
        tests = run_assert(req, total_deadline)
    elif runner == "stdio":
        tests = run_stdio(req, total_deadline)
    else:
        tests, runner = run_pytest(req, total_deadline)
    os.write(report, (MARKER + json.dumps({"tests": tests, "runner": runner}) + "\n").encode())


if __name__ == "__main__":
    main()

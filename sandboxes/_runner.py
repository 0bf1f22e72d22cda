"""Verification runner: runs inside the sandbox as one process per sample (standard library).

Reads ``{"code", "tests", "mode", "per_test_timeout", "total_timeout"}`` as JSON on stdin and
writes one line ``MARKER + JSON`` with per-test results to its original stdout. Each test runs
in its own forked child (new session, killed at its deadline), so a test that hangs, crashes
or exits cannot take the others with it. The candidate's output never reaches the runner's
stdout: in ``assert`` and ``pytest`` modes it goes to /dev/null, in ``stdio`` mode to a pipe
that the runner compares with the expected output.

``pytest`` mode writes the code to ``solution.py`` and the tests to ``test_solution.py`` in a
temp dir and runs real pytest (junit XML for per-test results, a SIGALRM per-test timeout). If
pytest is not importable in the image, a minimal built-in runner calls every top-level
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
import xml.etree.ElementTree as ET

MARKER = "\x00agentgym-verify\x00"
_REPORT_FD = None  # the runner's own stdout, where the one trusted report goes
OUTPUT_CAP = 1 << 20


def _not_dumpable():
    """PR_SET_DUMPABLE 0: test children (same uid) cannot open this process's fds via /proc."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _child(body, stdin_data, out_w, res_w, exit_ok):
    if _REPORT_FD is not None:
        os.close(_REPORT_FD)  # the candidate must not reach the runner's report channel
    os.setsid()
    fd = os.memfd_create("stdin")
    os.write(fd, stdin_data)
    os.lseek(fd, 0, os.SEEK_SET)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(fd, 0)
    os.dup2(out_w if out_w is not None else null, 1)
    os.dup2(null, 2)
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
    xml = os.path.join(d, "report.xml")

    def body():
        os.chdir(d)
        sys.path.insert(0, d)
        import pytest
        rc = pytest.main([d, "-q", "-p", "no:cacheprovider", "--junitxml", xml,
                          "-o", "junit_family=xunit1"], plugins=[_timeout_plugin(req)])
        if int(rc) not in (0, 1, 5):
            raise RuntimeError(f"pytest exit code {int(rc)}")
    result, _, dur = _isolated(body, b"", max(0.0, total_deadline - time.monotonic()), False)
    if not os.path.exists(xml):
        return [_record("pytest", result, dur)], "pytest"
    return _parse_junit(xml), "pytest"


def _timeout_plugin(req):
    import pytest

    class Timeout:
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
    return Timeout()


def _parse_junit(path):
    out = []
    for case in ET.parse(path).iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped") is not None
        message = "" if problem is None else (problem.get("message") or "")[:1000]
        status = ("skipped" if skipped else "passed" if problem is None else
                  "timeout" if "TimeoutError: test exceeded" in message + (problem.text or "")
                  else "failed")
        out.append({"name": case.get("name"), "passed": status == "passed", "status": status,
                    "message": message, "duration": float(case.get("time") or 0.0)})
    return out


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
    global _REPORT_FD
    _not_dumpable()
    req = json.loads(sys.stdin.read())
    report = _REPORT_FD = os.dup(1)
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

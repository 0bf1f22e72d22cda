"""`verify`: run a sample's tests in a sandbox, one call per sample, and score it.

Infrastructure failures (the sandbox backend failed) give ``reward=None`` and
``status="infra_error"`` so a trainer drops the sample from group statistics instead of
scoring it 0. Everything the code itself does (crash, hang, kill its runner, flood output)
is a failure of the code and scores as such.

Trust model: in ``assert`` and ``pytest`` modes the process that decides a test's verdict
never runs the candidate's code; it calls the candidate's functions in another process and
only plain data comes back (see ``_runner.py`` and docs/sandboxes.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from agentgym._errors import ConfigError, SandboxError

from . import _protocol
from ._docker import DockerSandbox
from ._lease import SandboxLease
from ._local import LocalSandbox
from ._pool import SandboxPool
from ._protocol import MAX_TIMEOUT_S, Sandbox, check_timeout
from ._result import ExecResult, ExecStatus

VerifyMode = Literal["assert", "stdio", "pytest"]
RewardKind = Literal["fraction", "all"]
VerifyStatus = Literal["passed", "failed", "infra_error"]
RUNNER_SOURCE = Path(__file__).with_name("_runner.py").read_text()
MARKER = "\x00agentgym-verify\x00"
# What the sandbox call's timeout adds to total_timeout. The runner stops at total_timeout
# (no test starts after it, the running one is cut at it) and then only ends the candidate's
# processes (at most FACTORY_WAIT_S, 2 s, in _runner.py); the slack covers that and the
# runner's start-up before its clock starts. A call killed at this outer deadline reports
# nothing, and every test's result is lost with it.
RUNNER_SLACK_S = 5.0


@dataclass(frozen=True)
class TestResult:
    """One test of one sample."""

    __test__ = False  # not a pytest test class

    name: str
    passed: bool
    status: Literal["passed", "failed", "timeout", "skipped"]
    message: str = ""  # the exception or mismatch, empty when passed
    duration: float = 0.0  # seconds


@dataclass(frozen=True)
class VerifyResult:
    """Per-test results and the sample's reward.

    ``reward`` is the pass fraction (``reward="fraction"``) or 1.0/0.0 (``"all"``), and None
    exactly when ``status == "infra_error"``; ``infra_error`` then says what failed.
    ``runner`` is ``assert``, ``stdio``, ``pytest`` or ``builtin`` (pytest missing in image).
    """

    tests: list[TestResult]
    reward: float | None
    status: VerifyStatus
    infra_error: str | None = None
    runner: str = ""
    exec_result: ExecResult | None = field(default=None, repr=False)

    @property
    def passed(self) -> bool:
        """True when every test passed."""
        return self.status == "passed"


def _payload(code: str, tests: Any, mode: str, per_test_timeout: float,
             total_timeout: float, reward: str) -> str:
    """The runner's stdin for one sample; `ConfigError` for any bad argument."""
    if reward not in ("fraction", "all"):
        raise ConfigError(f"reward must be 'fraction' or 'all', got {reward!r}")
    if mode not in ("assert", "stdio", "pytest"):
        raise ConfigError(f"mode must be assert, stdio or pytest, got {mode!r}")
    if mode == "pytest" and not isinstance(tests, str):
        tests = "\n\n".join(_snippets(tests, "pytest", "test module"))
    elif mode == "assert":
        tests = _snippets(tests, "assert", "test snippet")
    elif mode == "stdio":
        tests = _stdio_cases(tests)
    if not tests:
        raise ConfigError("verify needs at least one test")
    per_test_timeout = check_timeout(per_test_timeout, "per_test_timeout")
    # The call gets total_timeout + RUNNER_SLACK_S, which must itself be a valid timeout:
    # checked against MAX_TIMEOUT_S, a week was refused with an error about a `timeout` of
    # 604805 that the caller never passed.
    total_timeout = check_timeout(total_timeout, "total_timeout", MAX_TIMEOUT_S - RUNNER_SLACK_S)
    if not isinstance(code, str):
        raise ConfigError(f"code must be a str (the candidate's source), got "
                          f"{type(code).__name__}")
    return json.dumps({"code": code, "tests": tests if isinstance(tests, str) else list(tests),
                       "mode": mode, "per_test_timeout": per_test_timeout,
                       "total_timeout": total_timeout})


def _snippets(tests: Any, mode: str, what: str) -> list[str]:
    """The source strings of ``assert`` tests (or pytest parts); `ConfigError` for a bad one.

    Why up front: a test that is not a string would fail every sample as the candidate's
    failure, and a blank one asserts nothing, so it would pass every candidate.
    """
    if mode == "assert" and isinstance(tests, str):
        raise ConfigError("assert mode takes a list of test snippets, got one string: "
                          "wrap it in a list")
    if isinstance(tests, (bytes, Mapping)) or not isinstance(tests, Iterable):
        raise ConfigError(f"{mode} mode takes a list of {what}s (str), got one "
                          f"{type(tests).__name__}")
    snippets = list(tests)
    for i, snippet in enumerate(snippets):
        if not isinstance(snippet, str):
            raise ConfigError(f"{mode} test {i} is {type(snippet).__name__}, not str: each "
                              f"test is a {what} (Python source)")
        if mode == "assert" and not snippet.strip():
            raise ConfigError(f"assert test {i} is empty: it asserts nothing and would pass "
                              "every candidate; drop it or write an assert")
    return snippets


STDIO_SHAPE = '{"input": str, "output": str}'


def _stdio_cases(tests: Any) -> list[dict[str, str]]:
    """The ``stdio`` cases as the runner reads them; `ConfigError` naming the first bad one.

    Why up front: the runner reads only ``input`` and ``output``, so a case it cannot use
    (``stdin``/``stdout`` keys, a number as output) would fail every sample and blame the
    candidate's program. Other keys are dropped, not sent.
    """
    if isinstance(tests, (str, Mapping)):
        raise ConfigError(f"stdio mode takes a list of cases {STDIO_SHAPE}, got one "
                          f"{type(tests).__name__}: wrap it in a list")
    return [_stdio_case(i, case) for i, case in enumerate(tests)]


def _stdio_case(index: int, case: Any) -> dict[str, str]:
    """One case with string ``input`` and ``output`` (``""``: a program that reads nothing)."""
    if not isinstance(case, Mapping):
        raise ConfigError(f"stdio test {index} is {type(case).__name__}, not a mapping; each "
                          f"test is {STDIO_SHAPE}")
    for key in ("input", "output"):
        if not isinstance(case.get(key), str):
            got = f"{type(case[key]).__name__}, not str" if key in case else "missing"
            raise ConfigError(
                f"stdio test {index}: {key!r} is {got} (keys {sorted(str(k) for k in case)}); "
                f'each test is {STDIO_SHAPE}, "input": "" for a program that reads nothing')
    for key in ("input", "output"):
        try:
            case[key].encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no program can read or print it
            raise ConfigError(f"stdio test {index}: {key!r} is not valid Unicode text "
                              f"({exc.reason} at position {exc.start}); every candidate "
                              "would fail it") from None
    return {"input": case["input"], "output": case["output"]}


def _score(result: ExecResult, reward: str) -> VerifyResult:
    """Score the runner's report; anything the code did to it is a failure, never a raise."""
    if result.infra_error is not None:
        return VerifyResult([], None, "infra_error", result.infra_error, exec_result=result)
    # The runner's report is its last act: a marker line printed earlier is the code's forgery.
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith(MARKER)]
    try:
        report = json.loads(lines[-1][len(MARKER):])
        tests = [TestResult(**t) for t in report["tests"]]
        runner = str(report["runner"])
    except (IndexError, ValueError, TypeError, KeyError, RecursionError) as exc:
        why = (f"the test runner reported nothing readable (status {result.status.value}, "
               f"exit {result.exit_code}, {type(exc).__name__}); the code killed, starved or "
               "garbled it")
        tests = [TestResult("runner", False, "timeout" if result.status is ExecStatus.TIMEOUT
                            else "failed", why)]
        return VerifyResult(tests, 0.0, "failed", exec_result=result)
    counted = [t for t in tests if t.status != "skipped"]
    passed = sum(t.passed for t in counted)
    all_passed = bool(counted) and passed == len(counted)
    frac = passed / len(counted) if counted else 0.0
    value = frac if reward == "fraction" else float(all_passed)
    return VerifyResult(tests, value, "passed" if all_passed else "failed", runner=runner,
                        exec_result=result)


def _run_kwargs(sandbox: Any, payload: str, total_timeout: float) -> dict[str, Any]:
    """Keyword arguments of the runner's one call.

    Never in the agent's Python session, and with that session ended first: a thread it left
    running could rewrite the judge's workspace while the tests collect.
    """
    if not isinstance(sandbox, (Sandbox, SandboxPool)):
        raise ConfigError(f"sandbox must be a Sandbox or a SandboxPool, got "
                          f"{type(sandbox).__name__}")
    return {"stdin": payload, "timeout": total_timeout + RUNNER_SLACK_S, "session": False,
            "end_session": True}


def verify(code: str, tests: Sequence[Any] | str, mode: VerifyMode = "assert", *,
           sandbox: Sandbox | SandboxPool, per_test_timeout: float = 5.0,
           total_timeout: float = 30.0, reward: RewardKind = "fraction") -> VerifyResult:
    """Run ``tests`` against ``code`` in ``sandbox`` (a `Sandbox` or a `SandboxPool`).

    Modes: ``assert`` — ``tests`` is a list of Python snippets, each run after ``code`` in a
    fresh process (e.g. ``["assert add(1, 2) == 3"]``); ``stdio`` — ``code`` is a program,
    ``tests`` a list of ``{"input": str, "output": str}`` (output compared line by line,
    trailing whitespace ignored); ``pytest`` — ``tests`` is a test module that imports from
    ``solution`` (one that collects no tests fails the sample). Each test has
    ``per_test_timeout`` seconds, the whole sample ``total_timeout``. The whole batch is one
    sandbox call, on a clean sandbox: the session ended, the work dir, /tmp and /dev/shm
    emptied first (in the call: see `_cleans_in_the_call`; a pool's sandbox: by its reset), so
    a reused sandbox judges each sample on its own and **its files are gone afterwards**.
    Malformed arguments raise `ConfigError` before anything runs.
    """
    payload = _payload(code, tests, mode, per_test_timeout, total_timeout, reward)
    kwargs = _run_kwargs(sandbox, payload, total_timeout)
    if isinstance(sandbox, SandboxPool):
        _refuse_if_cancelled()  # before it waits for a lease, and takes one from a live episode
        with sandbox.lease() as sb:  # the pool reset it, and checked it is clean
            result = sb.run(RUNNER_SOURCE, **kwargs)
    else:
        result = _run_runner(sandbox, kwargs)
    _refuse_if_cancelled()
    return _score(result, reward)


def _refuse_if_cancelled() -> None:
    """Raise when this thread's call was cancelled (`CallToken`): before a lease, or after.

    Why before: a cancelled verify waited up to the lease timeout, then took a sandbox ahead
    of live episodes. Why after: the cancel killed the runner, so what came back is no outcome
    of the sample, and scoring it let the kill read as the code's failure. Its caller stopped
    waiting anyway.
    """
    if _protocol.call_cancelled():
        raise SandboxError("the verification was cancelled (its episode is over or timed "
                           "out); it has no outcome")


def _cleans_in_the_call(sandbox: Any) -> bool:
    """Whether ``sandbox`` (or the sandbox of a lease) takes ``run(..., fresh_workdir=True)``.

    Why: a sandbox reused for several samples (a bare one, or a lease verifying a group)
    kept what the last sample's code did: a /work it chmod'ed 000, a full /tmp, files. The
    next sample, correct or not, then failed as if its code had. These backends clean in the
    same request as the runner (no call can slip in between, even from another thread), a
    lease's gate included; other backends are reset first.
    """
    target = sandbox.sandbox if isinstance(sandbox, SandboxLease) else sandbox
    return isinstance(target, (DockerSandbox, LocalSandbox))


def _run_runner(sandbox: Any, kwargs: dict[str, Any]) -> ExecResult:
    """Run the runner on a clean sandbox: see `_cleans_in_the_call`."""
    if _cleans_in_the_call(sandbox):
        return cast(ExecResult, sandbox.run(RUNNER_SOURCE, fresh_workdir=True, **kwargs))
    try:
        sandbox.reset()
    except Exception as exc:
        return _not_clean(exc)
    return cast(ExecResult, sandbox.run(RUNNER_SOURCE, **kwargs))


async def _arun_runner(sandbox: Any, kwargs: dict[str, Any]) -> ExecResult:
    """Async twin of `_run_runner` (cancelled, it kills the runner's code)."""
    if _cleans_in_the_call(sandbox):
        return cast(ExecResult, await sandbox.arun(RUNNER_SOURCE, fresh_workdir=True, **kwargs))
    try:
        await sandbox.areset()
    except Exception as exc:
        return _not_clean(exc)
    return cast(ExecResult, await sandbox.arun(RUNNER_SOURCE, **kwargs))


def _not_clean(exc: Exception) -> ExecResult:
    return ExecResult.infra_failure(
        f"sandbox: reset() before verification failed ({type(exc).__name__}: {exc}); "
        "nothing ran. Use a new sandbox, or pass a SandboxPool", 0.0)


async def averify(code: str, tests: Sequence[Any] | str, mode: VerifyMode = "assert", *,
                  sandbox: Sandbox | SandboxPool, per_test_timeout: float = 5.0,
                  total_timeout: float = 30.0, reward: RewardKind = "fraction") -> VerifyResult:
    """Async twin of `verify`; with a pool, many samples verify in parallel."""
    payload = _payload(code, tests, mode, per_test_timeout, total_timeout, reward)
    kwargs = _run_kwargs(sandbox, payload, total_timeout)
    if isinstance(sandbox, SandboxPool):
        async with sandbox.alease() as sb:  # the pool reset it, and checked it is clean
            return _score(await sb.arun(RUNNER_SOURCE, **kwargs), reward)
    return _score(await _arun_runner(sandbox, kwargs), reward)

"""``agentgym eval --policy openai --max-retries N --retry-backoff S``: a flaky server's retries.

Why: `OpenAIPolicy` retries a request that failed in transit or got 429/5xx, but the command
built it with the defaults (3 retries, 0.5 s doubling), so a user of a rate-limited or flaky
server could not tune them. The server is a small stdlib one on loopback that answers 503 to
its first chat requests, played by the real command (`agentgym_here`).
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest

from agentgym import OpenAIPolicy, read_jsonl
from agentgym._eval_cli import evaluate
from tests.conftest import agentgym_here, send_json, serving


class _Flaky(BaseHTTPRequestHandler):
    """Serves model ``m``: 503 to the first ``failures`` chat requests, then a final answer.

    ``posts`` records when each chat request came (`time.monotonic`), for the test to count
    the attempts and measure the waits between them.
    """

    failures: ClassVar[int] = 0
    posts: ClassVar[list[float]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name): the command's /models check
        send_json(self, 200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            self.posts.append(time.monotonic())
            failing = len(self.posts) <= self.failures
        if failing:
            send_json(self, 503, {"error": {"message": "overloaded, try again"}})
            return
        message = {"role": "assistant", "content": "The answer is 90."}
        send_json(self, 200, {"choices": [{"message": message, "finish_reason": "stop"}]})

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the command's files and output."""


@pytest.fixture
def flaky() -> Iterator[type[_Flaky]]:
    """A fresh `_Flaky` class per test (its counters are class state), failing none yet."""
    yield type("Flaky", (_Flaky,), {"failures": 0, "posts": []})


def eval_openai(url: str, out: Path, *args: str) -> list[str]:
    """``agentgym eval calculator`` on one task against ``url``, as a user types it."""
    return ["eval", "calculator", "--policy", "openai", "--base-url", f"{url}/v1",
            "--model", "m", "-n", "1", "--out", str(out), *args]  # fmt: skip


def test_no_retries_make_the_first_503_an_infra_error(tmp_path: Path, flaky: type[_Flaky]) -> None:
    """``--max-retries 0``: one attempt; the 503 ends the episode infra_error (exit 75)."""
    flaky.failures = 1
    with serving(flaky) as url:
        proc = agentgym_here(*eval_openai(url, tmp_path / "out", "--max-retries", "0"))
    assert proc.returncode == 75, proc.stderr[-2000:]
    (episode,) = read_jsonl(tmp_path / "out" / "trajectories.jsonl")
    assert episode.status == "infra_error"
    assert "answered 503" in (episode.error or "") and "after 1 attempts" in (episode.error or "")
    assert len(flaky.posts) == 1  # no retry was made


@pytest.mark.parametrize(("failures", "code", "status"), [(2, 0, "ok"), (3, 75, "infra_error")],
                         ids=["two-503s-then-ok", "three-503s-outlast-it"])  # fmt: skip
def test_two_retries_carry_an_episode_past_two_failures_not_three(
    tmp_path: Path, flaky: type[_Flaky], failures: int, code: int, status: str
) -> None:
    """``--max-retries 2``: three attempts in all, so the answer after two 503s is played (ok),
    and three 503s end it infra_error: the option is applied, not the default 3 (which would
    outlast three)."""
    flaky.failures = failures
    with serving(flaky) as url:
        proc = agentgym_here(*eval_openai(url, tmp_path / "out", "--max-retries", "2",
                                          "--retry-backoff", "0"))  # fmt: skip
    assert proc.returncode == code, proc.stderr[-2000:]
    (episode,) = read_jsonl(tmp_path / "out" / "trajectories.jsonl")
    assert episode.status == status and len(flaky.posts) == 3
    if status == "ok":
        assert episode.final_reward == 1.0  # task 0 asks 66 + 24
        assert json.loads((tmp_path / "out" / "summary.json").read_text())["episodes"] == 1
    else:
        assert "after 3 attempts" in (episode.error or "")


def test_the_retry_backoff_is_waited_before_the_retry(tmp_path: Path, flaky: type[_Flaky]) -> None:
    """``--retry-backoff 0.7``: the retry comes at least 0.7 s after the failed attempt (more
    than the default 0.5 s would wait)."""
    flaky.failures = 1
    with serving(flaky) as url:
        proc = agentgym_here(*eval_openai(url, tmp_path / "out", "--max-retries", "1",
                                          "--retry-backoff", "0.7"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = flaky.posts
    assert second - first >= 0.7


def test_the_command_defaults_are_the_policys() -> None:
    """Left out, the options play as `OpenAIPolicy` does by default (3 retries, 0.5 s)."""
    command = inspect.signature(evaluate).parameters
    policy = inspect.signature(OpenAIPolicy).parameters
    for name in ("max_retries", "retry_backoff"):
        assert command[name].default == policy[name].default, name


@pytest.mark.parametrize("args", [["--max-retries", "1"], ["--retry-backoff", "0"]],
                         ids=["max-retries", "retry-backoff"])  # fmt: skip
@pytest.mark.parametrize("policy", ["reference", "hf"])
def test_a_retry_option_under_another_policy_is_one_line_naming_the_fix(
    tmp_path: Path, args: list[str], policy: str
) -> None:
    """Ignored under another policy, the option would read as applied."""
    local = ["--model-path", str(tmp_path / "model")] if policy == "hf" else []
    proc = agentgym_here("eval", "calculator", "--policy", policy, *local, "-n", "1",
                         *args, "--out", str(tmp_path / "out"))  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: {args[0]} applies to --policy openai, not {policy}; pass --policy openai, "
        f"or drop {args[0]}"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["--max-retries", "-1"], ["--retry-backoff", "-0.5"]],
                         ids=["max-retries", "retry-backoff"])  # fmt: skip
def test_a_negative_retry_option_is_refused(tmp_path: Path, args: list[str]) -> None:
    proc = agentgym_here(*eval_openai("http://127.0.0.1:9", tmp_path / "out", *args))
    assert proc.returncode == 2
    assert args[0] in proc.stderr and "greater than or equal to 0" in proc.stderr
    assert not (tmp_path / "out").exists()

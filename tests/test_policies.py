"""`OpenAIPolicy` against a real HTTP server on loopback that misbehaves on purpose."""

from __future__ import annotations

import contextlib
import gc
import json
import socket
import warnings
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import agentgym
from tests.conftest import send_json, serve_in_thread

REPLY = {
    "choices": [
        {
            "message": {"role": "assistant", "content": "42"},
            "finish_reason": "stop",
            "token_ids": [52, 50],
            "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]},
        }
    ],
    "prompt_token_ids": [1, 2, 3],
}


class FlakyServer(ThreadingHTTPServer):
    """Answers each POST with the next (status, body) of ``script``, then the last one forever."""

    def __init__(self, script: list[tuple[int, dict]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.requests: list[dict] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: FlakyServer
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's server does

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        status, reply = self.server.script[
            min(len(self.server.requests), len(self.server.script)) - 1
        ]
        send_json(self, status, reply)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def running_servers(make_server: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """A function that starts a loopback server ``make_server`` builds; all stop on leaving."""
    servers: list[Any] = []

    def start(*args: Any) -> Any:
        server = make_server(*args)
        serve_in_thread(server)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def serve() -> Iterator:
    with running_servers(FlakyServer) as start:
        yield start


async def test_retries_transient_errors_then_returns_tokens(serve) -> None:
    server = serve([(503, {"error": "warming up"}), (429, {"error": "busy"}), (200, REPLY)])
    policy = agentgym.OpenAIPolicy(server.base_url, "m", retry_backoff=0.01)
    completion = await policy.generate([{"role": "user", "content": "hi"}], [])
    await policy.aclose()
    assert len(server.requests) == 3
    assert completion.text == "42"
    assert completion.prompt_ids == [1, 2, 3] and completion.completion_ids == [52, 50]
    assert completion.logprobs == [-0.5, -0.25]
    assert server.requests[0]["return_token_ids"] is True and server.requests[0]["logprobs"]


async def test_the_callers_per_turn_limit_wins_over_the_policys_default(serve) -> None:
    """An env's ``max_tokens_per_turn`` was overridden by ``sampling={"max_tokens": ...}``:
    turns ran past the budget the rollout set, as no token policy lets them."""
    server = serve([(200, REPLY)])
    policy = agentgym.OpenAIPolicy(server.base_url, "m", sampling={"max_tokens": 16})
    await policy.generate([{"role": "user", "content": "hi"}], [], max_tokens=8)
    await policy.generate([{"role": "user", "content": "hi"}], [])
    await policy.aclose()
    assert [r["max_tokens"] for r in server.requests] == [8, 16]


def test_each_episode_and_turn_sends_its_own_seed(serve) -> None:
    """One seed sent with every request sampled a group's episodes (same prompt) alike."""
    server = serve([(200, REPLY)])
    policy = agentgym.OpenAIPolicy(server.base_url, "m", sampling={"seed": 5})
    agentgym.rollout("calculator", policy, num_tasks=2, group_size=2, seed=10)
    assert sorted(r["seed"] for r in server.requests) == [10005, 11005, 12005, 13005]
    server.requests.clear()
    agentgym.rollout("calculator", agentgym.OpenAIPolicy(server.base_url, "m"), num_tasks=1)
    assert "seed" not in server.requests[0]  # no base seed: the server draws


async def test_gives_up_after_max_retries_with_a_model_error(serve) -> None:
    server = serve([(503, {"error": "down"})])
    policy = agentgym.OpenAIPolicy(server.base_url, "m", max_retries=2, retry_backoff=0.01)
    with pytest.raises(agentgym.ModelError, match="503.*after 3 attempts"):
        await policy.generate([{"role": "user", "content": "hi"}], [])
    await policy.aclose()
    assert len(server.requests) == 3


async def test_bad_request_is_not_retried(serve) -> None:
    server = serve([(400, {"error": "bad field"})])
    policy = agentgym.OpenAIPolicy(server.base_url, "m", retry_backoff=0.01)
    with pytest.raises(agentgym.ModelError, match="400"):
        await policy.generate([{"role": "user", "content": "hi"}], [])
    await policy.aclose()
    assert len(server.requests) == 1


async def test_connection_refused_is_a_model_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    policy = agentgym.OpenAIPolicy(
        f"http://127.0.0.1:{port}/v1", "m", max_retries=1, retry_backoff=0.01
    )
    with pytest.raises(agentgym.ModelError, match="ConnectError"):
        await policy.generate([{"role": "user", "content": "hi"}], [])
    await policy.aclose()


def test_unreachable_server_makes_infra_error_episodes_not_zero_rewards(serve) -> None:
    server = serve([(502, {"error": "bad gateway"})])
    policy = agentgym.OpenAIPolicy(server.base_url, "m", max_retries=0)
    trajectories = agentgym.rollout("calculator", policy, num_tasks=2)
    assert [t.status for t in trajectories] == ["infra_error", "infra_error"]
    assert all(t.final_reward is None for t in trajectories)
    summary = agentgym.summarize(trajectories)
    assert summary["reward/mean"] is None and summary["status"]["infra_error"] == 2


def test_negative_retries_are_a_config_error() -> None:
    with pytest.raises(agentgym.ConfigError, match="max_retries"):
        agentgym.OpenAIPolicy("http://127.0.0.1:1/v1", "m", max_retries=-1)


@pytest.mark.parametrize("url", ["localhost:8000/v1", "127.0.0.1:8000", "ftp://host/v1", "http://"])
def test_a_base_url_that_is_not_an_http_url_is_a_config_error(url: str) -> None:
    # every request failed and every episode was filed as the server's failure (infra_error)
    with pytest.raises(agentgym.ConfigError, match=r"must be an http\(s\) URL"):
        agentgym.OpenAIPolicy(url, "m")


@pytest.mark.parametrize(
    "url", ["http://h:8000/v1?api-version=1", "http://h/v1#x", "http://me:pw@h:8000/v1"]
)
def test_a_base_url_with_more_than_the_servers_root_is_a_config_error(url: str) -> None:
    """A query had /chat/completions appended after it (every request a 404, every episode
    infra_error); a user:password went out as basic auth over the key, and into every error."""
    with pytest.raises(agentgym.ConfigError, match=r"no \?query, #fragment or user:password@"):
        agentgym.OpenAIPolicy(url, "m")


def test_sync_rollouts_reuse_the_policy_and_leave_no_open_connections(serve) -> None:
    server = serve([(200, REPLY)])
    policy = agentgym.OpenAIPolicy(server.base_url, "m")
    gc.collect()  # earlier tests' garbage warns on collection too: only this test's counts
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # each rollout() runs its own event loop
            [trajectory] = agentgym.rollout("calculator", policy, num_tasks=1)
            assert trajectory.status == "ok" and trajectory.turns[0].completion_ids == [52, 50]
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks
    assert len(server.requests) == 2

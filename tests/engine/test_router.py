"""The client-side router's policy, adapter staging, and the request a turn sends (no vLLM)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentgym import ConfigError, ModelError
from agentgym.engine import RemoteVLLMPolicy, StickyLeastLoaded, VLLMFleet, stage_adapter
from tests.conftest import send_json, serve_in_thread

A, B, C = "http://a", "http://b", "http://c"


def test_an_episode_stays_on_its_replica_and_new_ones_go_to_the_least_loaded() -> None:
    router = StickyLeastLoaded([A, B])
    first = router.choose("e1")
    second = router.choose("e2")  # e1 holds one request on `first`: e2 goes elsewhere
    assert {first.url, second.url} == {A, B}
    router.release(first)
    again = router.choose("e1")
    assert again is first and router.stats.sticky == 1 and router.stats.placed == 2


def test_ties_go_to_the_replica_chosen_least_recently_so_a_quiet_run_spreads() -> None:
    router = StickyLeastLoaded([A, B, C])
    chosen = []
    for k in range(6):  # one episode at a time: every replica idle at each choice
        replica = router.choose(f"e{k}")
        chosen.append(replica.url)
        router.release(replica)
        router.finish(f"e{k}")
    assert chosen == [A, B, C, A, B, C]


def test_a_pinned_episode_moves_when_its_replica_is_overloaded() -> None:
    router = StickyLeastLoaded([A, B], max_imbalance=2)
    home = router.choose("pinned")
    router.release(home)
    for k in range(3):  # three other episodes land on `home` (B is made to look busy)
        router.replicas[B if home.url == A else A].in_flight += 10
        router.choose(f"x{k}")
        router.replicas[B if home.url == A else A].in_flight -= 10
    assert home.in_flight == 3
    moved = router.choose("pinned")
    assert moved is not home and router.stats.moved == 1
    assert "pinned" in moved.sessions and "pinned" not in home.sessions


def test_a_down_replica_is_routed_around_and_none_left_is_a_model_error() -> None:
    router = StickyLeastLoaded([A, B])
    home = router.choose("e")
    router.release(home)
    router.mark_down(home.url, "connection refused", cool_off=60)
    other = router.choose("e")
    assert other is not home and router.stats.moved == 1
    router.release(other)
    router.mark_down(other.url, "killed", cool_off=60)
    with pytest.raises(ModelError, match="no rollout server is up.*killed"):
        router.choose("e")
    assert router.due_for_probe() == []  # cool-off not over: nobody probes yet
    router.mark_down(A, "refused", cool_off=0)
    assert [r.url for r in router.due_for_probe()] == [A]
    router.mark_up(A)
    assert router.choose("e").url == A


def test_bad_router_input_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        StickyLeastLoaded([])
    with pytest.raises(ConfigError, match="distinct"):
        StickyLeastLoaded([A, A])


def test_an_adapter_is_staged_by_rename_and_a_second_stage_reuses_it(tmp_path: Path) -> None:
    source = tmp_path / "adapter"
    source.mkdir()
    (source / "adapter_config.json").write_text("{}")
    shared = tmp_path / "shared"
    shared.mkdir()
    staged = stage_adapter(source, shared, 3)
    assert staged == shared / "agentgym-v3"
    assert (staged / "adapter_config.json").read_text() == "{}"
    assert [p.name for p in shared.iterdir()] == ["agentgym-v3"]  # no temporary left behind
    (source / "adapter_config.json").write_text('{"changed": true}')
    assert stage_adapter(source, shared, 3) == staged  # a resumed run keeps what servers read
    assert (staged / "adapter_config.json").read_text() == "{}"


class CompletionServer(ThreadingHTTPServer):
    """A stand-in completions endpoint (token ids back) that records the headers it got."""

    def __init__(self) -> None:
        self.headers_seen: list[dict[str, str]] = []
        seen = self.headers_seen

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                seen.append(dict(self.headers))
                choice = {"text": "a", "token_ids": [97], "finish_reason": "stop",
                          "logprobs": {"token_logprobs": [-0.5]}}  # fmt: skip
                send_json(self, 200, {"choices": [choice]})

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


async def test_turns_carry_the_fleets_bearer_token(tiny_model_dir: Path) -> None:
    server = CompletionServer()
    serve_in_thread(server)
    try:
        fleet = VLLMFleet([server.url], "tiny", api_key="s3cret")
        policy = RemoteVLLMPolicy(tiny_model_dir, fleet, sampling={"max_tokens": 4})
        turn = await policy.generate_ids([1, 2, 3], session="e")
        await policy.aclose()
    finally:
        server.shutdown()
    assert (turn.completion_ids, turn.logprobs, turn.adapter_version) == ([97], [-0.5], 0)
    assert server.headers_seen[0]["Authorization"] == "Bearer s3cret"


class LaggingStorageServer(ThreadingHTTPServer):
    """A stand-in adapter API whose shared storage shows a folder only after ``misses`` loads."""

    def __init__(self, misses: int) -> None:
        self.misses = misses
        self.served = {"tiny"}
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                send_json(self, 200, {"data": [{"id": name} for name in sorted(state.served)]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if state.misses:  # vLLM's own error object, not the framework's bare 404
                    state.misses -= 1
                    send_json(self, 404, {"error": {"message": "adapter path not found"}})
                    return
                state.served.add(body["lora_name"])
                send_json(self, 200, "Success")

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


async def test_loads_retried_for_lagging_storage_are_a_logged_metric(tmp_path: Path) -> None:
    """`docs/deployment.md` tells operators to watch these retries: the trainer logs
    `VLLMFleet.metrics()`, which left them out."""
    server = LaggingStorageServer(misses=2)
    serve_in_thread(server)
    try:
        fleet = VLLMFleet([server.url], "tiny", load_timeout=30)
        assert fleet.metrics()["router/not_found_retries"] == 0.0
        report = await fleet.publish(tmp_path, 1)
        await fleet.aclose()
    finally:
        server.shutdown()
    assert report.servers == (server.url,) and fleet.not_found_retries == 2
    assert fleet.metrics()["router/not_found_retries"] == 2.0

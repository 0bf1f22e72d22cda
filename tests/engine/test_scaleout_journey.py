"""Scale-out mistakes a user makes, and races a fleet meets, on stand-in vLLM servers.

Found by playing docs/deployment.md end to end: a wrong or stopped router URL ran every
episode to ``infra_error`` instead of stopping at the start; a server down at the start was
reported without saying what to change; and a server that came back while an adapter version
was being published took traffic for a version it did not serve. Stand-ins:
`tests.engine.fault_server` (real HTTP on loopback).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentgym import ConfigError, ModelError
from agentgym.engine import RemoteVLLMPolicy, VLLMFleet
from agentgym.engine._fleet import adapter_name
from agentgym.engine._serve import free_port
from tests.engine.fault_server import FaultServer, fault_servers

PROMPT = [1, 2, 3, 4]


def make_policy(
    model_dir: Path, urls: list[str], router_url: str | None = None
) -> RemoteVLLMPolicy:
    fleet = VLLMFleet(urls, "tiny", timeout=3.0, cool_off=3600)
    return RemoteVLLMPolicy(model_dir, fleet, router_url=router_url, sampling={"max_tokens": 8})


def completions(servers: list[FaultServer]) -> int:
    return sum(len(s.completions) for s in servers)


# ---- wrong URLs are refused at the start, naming the option to fix ----------------------------


def test_a_router_url_nothing_listens_on_is_refused_before_any_episode(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    router = f"http://127.0.0.1:{free_port()}"
    policy = make_policy(tiny_model_dir, [s.url for s in pair], router_url=router)
    with pytest.raises(ModelError, match=r"127\.0\.0\.1.*start that router.*--router-url"):
        policy.start()
    assert completions(pair) == 0


def test_a_router_in_front_of_another_model_is_a_config_error(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    with fault_servers(1, model="someone-else") as (router,):
        policy = make_policy(tiny_model_dir, [s.url for s in pair], router_url=router.url)
        with pytest.raises(ConfigError, match=r"not 'tiny'; give the servers' --served-model-name "
                           r"as the model name \(--model NAME; train: rollout_model_name\)"):
            policy.start()


def test_a_router_that_serves_the_model_passes_the_start_check(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    policy = make_policy(tiny_model_dir, [pair[0].url], router_url=f"{pair[1].url}/v1")
    policy.start()  # a vLLM server answers as a router would: accepted
    assert policy.router_url == pair[1].url


def test_a_server_down_at_the_start_names_the_option_to_fix(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    policy = make_policy(tiny_model_dir, [pair[0].url, dead])
    with pytest.raises(ModelError, match=r"unreachable.*start that server.*rollout_servers"):
        policy.start()


def test_a_server_that_cannot_load_adapters_is_refused_at_the_start_of_training(
    pair: list[FaultServer], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """It failed the first sync, after a step, as infra (exit 75: a retry that cannot help)."""
    from agentgym.trainers import GRPOConfig, GRPOTrainer
    from tests.conftest import TINY_RUN

    pair[1].load_fault = "no_route"  # started without VLLM_ALLOW_RUNTIME_LORA_UPDATING
    urls = [s.url for s in pair]
    publishing = RemoteVLLMPolicy(tiny_model_dir, VLLMFleet(urls, "tiny"), publishes_adapters=True)
    fix = rf"{pair[1].url} has no /v1/load_lora_adapter: start it with --enable-lora"
    with pytest.raises(ConfigError, match=fix):
        publishing.start()
    make_policy(tiny_model_dir, urls).start()  # an eval loads no adapter: the same servers do
    config = GRPOConfig.from_dict({
        **TINY_RUN, "model": str(tiny_model_dir), "output_dir": str(tmp_path / "run"),
        "rollout_servers": urls, "rollout_model_name": "tiny",
    })  # fmt: skip
    with pytest.raises(ConfigError, match=fix):
        GRPOTrainer(config)  # before the model loads and before the run folder is made
    assert not (tmp_path / "run").exists()
    assert [s.loads for s in pair] == [[], []] and completions(pair) == 0


# ---- a server that comes back during a publish serves the new version first ------------------


def gate_loads(
    fleet: VLLMFleet, monkeypatch: pytest.MonkeyPatch, url: str, name: str | None = None
) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold adapter loads on ``url`` (of ``name``, or any) until the returned gate opens."""
    original, entered, gate = fleet._load, asyncio.Event(), asyncio.Event()

    async def held(target: str, lora: str, path: str) -> None:
        if target == url and name in (None, lora):
            entered.set()
            await gate.wait()
        await original(target, lora, path)

    monkeypatch.setattr(fleet, "_load", held)
    return entered, gate


def restarted(fleet: VLLMFleet, server: FaultServer) -> None:
    """``server`` came back empty and its cool-off passed: the next request probes it."""
    server.served = {server.model}
    fleet.router.mark_down(server.url, "killed", 0.0)


async def fleet_with_one_restarted(pair: list[FaultServer], adapter: Path) -> VLLMFleet:
    """A fleet over ``pair`` serving v1, whose second server came back empty (due a probe)."""
    fleet = VLLMFleet([s.url for s in pair], "tiny", timeout=3.0, cool_off=3600)
    await fleet.publish(adapter, 1)
    restarted(fleet, pair[1])
    return fleet


def healthy_without(fleet: VLLMFleet, servers: list[FaultServer], version: int) -> list[str]:
    name = adapter_name(version)
    return [s.url for s in servers if fleet.router.replicas[s.url].healthy and name not in s.served]


async def test_a_publish_during_a_rejoin_reaches_the_rejoining_server(
    pair: list[FaultServer], adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steady, back = pair
    fleet = await fleet_with_one_restarted(pair, adapter)
    entered, gate = gate_loads(fleet, monkeypatch, back.url)
    probe = asyncio.create_task(fleet._probe_due())  # reloading v1 on the restarted server
    await entered.wait()
    await fleet.publish(adapter, 2)  # only `steady` is healthy: v2 goes there
    gate.set()
    await probe
    await fleet.aclose()
    assert fleet.router.replicas[back.url].healthy
    assert healthy_without(fleet, pair, 2) == []


async def test_a_server_that_rejoined_mid_publish_gets_the_version_before_traffic(
    pair: list[FaultServer], adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steady, back = pair
    fleet = await fleet_with_one_restarted(pair, adapter)
    entered, gate = gate_loads(fleet, monkeypatch, steady.url, adapter_name(2))
    publish = asyncio.create_task(fleet.publish(adapter, 2))  # v2 loading on `steady`
    await entered.wait()
    await fleet._probe_due()  # `back` rejoins with v1, the only version kept so far
    gate.set()
    await publish
    async with fleet.replica("episode"):  # the next request brings `back` up to date first
        pass
    await fleet.aclose()
    assert fleet.adapter_version == 2
    assert healthy_without(fleet, pair, 2) == []
    assert fleet.router.replicas[back.url].healthy


# ---- a probe of a server that does not answer never holds a turn ------------------------------


def hold_model_lists(
    fleet: VLLMFleet, monkeypatch: pytest.MonkeyPatch, url: str
) -> tuple[asyncio.Event, asyncio.Event]:
    """``url``'s ``/v1/models`` answers only once the returned gate opens (a silent host)."""
    original, asked, gate = fleet.served_names, asyncio.Event(), asyncio.Event()

    async def held(target: str) -> set[str]:
        if target == url:
            asked.set()
            await gate.wait()
        return await original(target)

    monkeypatch.setattr(fleet, "served_names", held)
    return asked, gate


async def test_a_turn_does_not_wait_out_the_probe_of_a_silent_server(
    pair: list[FaultServer], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up, silent = pair
    policy = make_policy(tiny_model_dir, [s.url for s in pair])
    policy.fleet.probe_wait = 0.05
    policy.fleet.router.mark_down(silent.url, "killed", 0.0)  # its cool-off has passed
    asked, gate = hold_model_lists(policy.fleet, monkeypatch, silent.url)
    turn = await asyncio.wait_for(policy.generate_ids(PROMPT, session="e"), timeout=20)
    assert asked.is_set() and silent.url in policy.fleet._probes  # probed, still unanswered
    assert (len(up.completions), len(silent.completions)) == (1, 0)
    assert turn.completion_ids
    gate.set()  # the host answers: the probe finishes in the background and it rejoins
    await asyncio.gather(*policy.fleet._probes.values())
    assert policy.fleet.router.replicas[silent.url].healthy
    await policy.aclose()


async def test_closing_stops_a_pending_probe_and_leaves_the_server_due(
    pair: list[FaultServer], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    silent = pair[1]
    policy = make_policy(tiny_model_dir, [s.url for s in pair])
    policy.fleet.probe_wait = 0.05
    policy.fleet.router.mark_down(silent.url, "killed", 0.0)
    asked, _ = hold_model_lists(policy.fleet, monkeypatch, silent.url)
    await asyncio.wait_for(policy.generate_ids(PROMPT, session="e"), timeout=20)
    await policy.aclose()
    assert asked.is_set() and not policy.fleet._probes
    assert policy.fleet.router.due_for_probe()[0].url == silent.url  # probed again next time


async def test_with_no_server_up_a_turn_waits_for_the_probe(
    pair: list[FaultServer], tiny_model_dir: Path
) -> None:
    only = pair[0]
    policy = make_policy(tiny_model_dir, [only.url])
    policy.fleet.probe_wait = 0.0
    policy.fleet.router.mark_down(only.url, "restarted", 0.0)
    turn = await policy.generate_ids(PROMPT, session="e")
    await policy.aclose()
    assert turn.completion_ids and policy.fleet.router.replicas[only.url].healthy


async def test_a_resumed_process_unloads_the_killed_ones_versions_and_its_own_at_the_end(
    pair: list[FaultServer], tiny_model_dir: Path, adapter: Path
) -> None:
    """Nothing unloaded a killed process's versions, nor a finished run's last two: each
    long-lived server kept them until it restarted, in its --max-loras slots."""
    from agentgym.engine._fleet import run_namespace

    killed, other_run = run_namespace("run1"), run_namespace("run2")
    left = {adapter_name(v, killed) for v in (3, 4)} | {adapter_name(1, other_run)}
    for server in pair:
        server.served |= left
    fleet = VLLMFleet([s.url for s in pair], "tiny", namespace=run_namespace("run1"))
    policy = RemoteVLLMPolicy(tiny_model_dir, fleet, publishes_adapters=True)
    await asyncio.to_thread(policy.start)
    for server in pair:  # the killed process's, never another run's (it may be live)
        assert sorted(server.unloads) == sorted(adapter_name(v, killed) for v in (3, 4))
        assert server.served == {"tiny", adapter_name(1, other_run)}
    await policy.aload_adapter(adapter, 1)
    await policy.aload_adapter(adapter, 2)
    await policy.aclose()
    await asyncio.to_thread(policy.unload_published)  # the run is over
    assert [s.served for s in pair] == [{"tiny", adapter_name(1, other_run)}] * 2
    assert policy.fleet.adapters == []


def test_a_resumed_process_names_its_adapters_apart_from_the_killed_ones(tmp_path) -> None:
    """Under one name per run, a resumed run's redone v1 met the killed process's staged v1
    (reused) and the servers' loaded v1 (skipped): rollouts of the old weights, unnoticed."""
    from agentgym.engine._fleet import VLLMFleet, run_namespace, stage_adapter

    source = tmp_path / "adapter"
    source.mkdir()
    (source / "adapter_config.json").write_text("{}")
    killed, resumed = run_namespace("run1"), run_namespace("run1")
    assert killed != resumed and killed.startswith("run1.") and resumed.startswith("run1.")
    first = stage_adapter(source, tmp_path / "shared", 1, killed)
    again = stage_adapter(source, tmp_path / "shared", 1, resumed)
    assert first != again and again.is_dir()  # a copy of its own, not the killed one's
    fleet = VLLMFleet(["http://127.0.0.1:1"], "tiny", namespace=resumed)
    assert fleet.version_of(again.name) == 1 and fleet.version_of(first.name) is None

"""Scale-out figures on one machine: router overhead per request, adapter publish time.

    python bench/fleet_bench.py [--requests 200] [--publishes 8]

Starts two vLLM-CPU servers on the tiny local model (LoRA on) and vllm-router before them,
then measures, interleaved so that machine noise hits every mode alike:

- a one-token completion sent straight to a server, through the client-side router
  (`VLLMFleet`), and through vllm-router (``sticky_least_loaded``): p50/p99 and the p50 overhead;
- publishing an adapter version (``/v1/load_lora_adapter`` + the fleet's checks) to one server
  and to both.

Same-machine limits: both servers share this machine's cores, so these are the router's and
the fan-out's own costs, not a throughput gain from a second server.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from agentgym.engine import (
    RemoteVLLMPolicy,
    ServerOptions,
    VLLMFleet,
    serve_router,
    serve_vllm_fleet,
)
from agentgym.engine.tiny import build_tiny_model, save_random_adapter


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def request_latencies(
    model_dir: Path, roots: list[str], router_url: str, requests: int
) -> dict[str, list[float]]:
    fleet = VLLMFleet(roots, "tiny")
    sampling = {"temperature": 0.0, "max_tokens": 1}
    modes = {
        "client router": RemoteVLLMPolicy(model_dir, fleet, sampling=sampling),
        "vllm-router": RemoteVLLMPolicy(model_dir, fleet, router_url=router_url,
                                        sampling=sampling),
    }  # fmt: skip
    prompt = modes["client router"].renderer.prompt_ids([{"role": "user", "content": "hi"}], [])
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "return_token_ids": True, "logprobs": 0}  # fmt: skip
    times: dict[str, list[float]] = {"direct": [], **{name: [] for name in modes}}
    order = random.Random(0)
    async with httpx.AsyncClient(timeout=60) as client:
        for k in range(requests + 10):  # the first 10 rounds warm connections up
            elapsed = {}
            for name in order.sample(sorted(times), len(times)):  # no mode always goes first
                t0 = time.perf_counter()
                if name == "direct":
                    response = await client.post(f"{roots[k % 2]}/v1/completions", json=body)
                    response.raise_for_status()
                else:
                    await modes[name].generate_ids(prompt, session=f"s{k}")
                elapsed[name] = time.perf_counter() - t0
            for policy in modes.values():
                await policy.end_session(f"s{k}")
            if k >= 10:
                for name, seconds in elapsed.items():
                    times[name].append(seconds)
    for policy in modes.values():
        await policy.aclose()
    return times


async def publish_seconds(
    roots: list[str], adapter: Path, publishes: int
) -> dict[int, list[float]]:
    # each fleet keeps 2 versions; the first server holds both fleets' (4 <= --max-loras 6),
    # so no load waits for an eviction
    fleets = {1: VLLMFleet(roots[:1], "tiny"), 2: VLLMFleet(roots, "tiny")}
    seconds: dict[int, list[float]] = {1: [], 2: []}
    for version in range(1, publishes + 1):
        for count, fleet in fleets.items():
            # a fresh version number per fleet: vLLM never sees the same name twice
            report = await fleet.publish(adapter, version * 10 + count)
            seconds[count].append(report.seconds)
    for fleet in fleets.values():
        await fleet.aclose()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--publishes", type=int, default=8)
    args = parser.parse_args()
    model_dir = build_tiny_model()
    adapter = save_random_adapter(model_dir, Path(tempfile.mkdtemp()) / "adapter",
                                  targets=["q_proj", "v_proj"])
    options = ServerOptions(served_name="tiny", max_model_len=2048, enable_lora=True,
                            max_lora_rank=8, max_loras=6)  # fmt: skip
    with serve_vllm_fleet(model_dir, 2, options) as servers:
        roots = [s.root for s in servers]
        with serve_router(roots) as router_url:
            times = asyncio.run(request_latencies(model_dir, roots, router_url, args.requests))
        publish = asyncio.run(publish_seconds(roots, adapter, args.publishes))
    direct = statistics.median(times["direct"])
    print(f"one-token completions, {args.requests} each, interleaved (2 vLLM-CPU servers):")
    for name, values in times.items():
        p50, p99 = statistics.median(values), percentile(values, 0.99)
        extra = "" if name == "direct" else f"  overhead p50 {1000 * (p50 - direct):+.2f} ms"
        print(f"  {name:<14} p50 {1000 * p50:7.2f} ms  p99 {1000 * p99:7.2f} ms{extra}")
    one, two = statistics.median(publish[1]), statistics.median(publish[2])
    print(f"adapter publish (load on every server + checks), median of {args.publishes}:")
    print(f"  1 server {1000 * one:.1f} ms, 2 servers {1000 * two:.1f} ms "
          f"(ratio {two / one:.2f}x; loads run concurrently)")  # fmt: skip
    print("same machine: both servers share its cores; figures are the routing and fan-out costs")


if __name__ == "__main__":
    main()

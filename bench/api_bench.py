"""Latency of ``agentgym serve`` under load: N concurrent clients on loopback, p50/p99 per endpoint.

Starts a real server subprocess on a fresh database (SQLite by default, ``--db URL`` for
PostgreSQL), indexes ``--runs`` runs, then has ``--clients`` asyncio clients alternate
``GET /jobs?limit=50`` and ``GET /jobs/{id}`` for ``--requests`` timed requests each, after
a few untimed ones per client (``WARMUP``) that open its connection.

    .venv/bin/python bench/api_bench.py --clients 16 --requests 200
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from agentgym.runs import RunStatus, RunStore

#: Untimed requests per client before its timed ones (one of each endpoint, twice): the
#: connections' setup and the server's first-request costs stay out of the p99.
WARMUP = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200, help="per client")
    parser.add_argument("--runs", type=int, default=1000, help="rows in the index")
    parser.add_argument("--db", default=None, help="database URL (default: a temp SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or f"sqlite:///{Path(tmp) / 'runs.db'}"
        ids = seed(RunStore(db), args.runs)
        server, url = start_server(db, Path(tmp))
        try:
            latencies = asyncio.run(load(url, ids, args.clients, args.requests))
        finally:
            server.terminate()
            server.wait(timeout=30)
    backend = db.split(":", 1)[0]
    print(f"agentgym serve, {backend}, {args.runs} runs, {args.clients} concurrent clients")
    for endpoint, values in latencies.items():
        ms = sorted(v * 1000 for v in values)
        p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        print(f"  {endpoint:<18} n={len(ms):>6}  p50 {statistics.median(ms):7.2f} ms  "
              f"p99 {p99:7.2f} ms")  # fmt: skip


def seed(store: RunStore, n: int) -> list[str]:
    """``n`` finished eval runs with a config and figures, as the CLI hook writes them."""
    return [
        store.create_run(
            kind="eval",
            name=f"bench-{i}",
            config={"env": "calculator", "num_tasks": i},
            source="cli",
            status=RunStatus.finished,
            figures={"reward/mean": random.random()},
        )  # fmt: skip
        for i in range(n)
    ]


def start_server(db: str, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    log = root / "server.log"
    command = [sys.executable, "-c", "from agentgym.cli import main; main()", "serve",
               "--port", "0", "--db", db, "--runs-dir", str(root / "runs")]  # fmt: skip
    env = {**os.environ, "AGENTGYM_HOME": str(root)}
    with log.open("wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while "listening on" not in (text := log.read_text()):
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start:\n{text}")
        time.sleep(0.05)
    url = text.split("listening on ", 1)[1].split()[0]
    with httpx.Client(base_url=url) as client:  # the first request waits for the lifespan
        client.get("/health", timeout=60).raise_for_status()
    return server, url


async def load(url: str, ids: list[str], clients: int, requests: int) -> dict[str, list[float]]:
    latencies: dict[str, list[float]] = {"GET /jobs?limit=50": [], "GET /jobs/{id}": []}
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one_client(seed: int) -> None:
            rng = random.Random(seed)
            for i in range(WARMUP):  # untimed: opens this client's connection, warms caches
                path = "/jobs?limit=50" if i % 2 == 0 else f"/jobs/{rng.choice(ids)}"
                (await client.get(path)).raise_for_status()
            for i in range(requests):
                path, key = (
                    ("/jobs?limit=50", "GET /jobs?limit=50") if i % 2 == 0
                    else (f"/jobs/{rng.choice(ids)}", "GET /jobs/{id}")
                )  # fmt: skip
                started = time.perf_counter()
                response = await client.get(path)
                latencies[key].append(time.perf_counter() - started)
                response.raise_for_status()

        await asyncio.gather(*(one_client(i) for i in range(clients)))
    return latencies


if __name__ == "__main__":
    main()

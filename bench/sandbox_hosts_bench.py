"""Sandbox throughput through one pool on one Docker host vs two (local + TLS), side by side.

    .venv/bin/python bench/sandbox_hosts_bench.py [--leases 300] [--concurrency 8] [--rounds 3]

Each lease runs ``print(1)`` once, so a lease's reset and hand-off are in the figure. The
second host is a ``dockerd --tlsverify`` on loopback started for the run (the tests' helper,
``tests/sandboxes/tls_daemon.py``), so it needs root, ``dockerd``, ``openssl`` and the image
from ``agentgym sandbox build``. Both daemons share this machine's cores, so the ratio shows
what routing over two hosts costs, not a speed-up. The three pools stay started through the
whole run (each keeps its warm sandboxes between its rounds), and the configs' order rotates
round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.sandboxes.tls_daemon

from agentgym.sandboxes import DEFAULT_IMAGE, DockerHost, SandboxPool  # noqa: E402
from tests.sandboxes.tls_daemon import TlsDaemon  # noqa: E402


async def leases_per_second(pool: SandboxPool, leases: int, concurrency: int) -> float:
    """Leases per second, each running ``print(1)`` once, ``concurrency`` at a time."""
    left = leases

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with pool.alease(timeout=60) as sb:
                result = await sb.arun("print(1)")
                if result.stdout != "1\n":
                    raise RuntimeError(f"benchmark run failed: {result}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return leases / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=300, help="leases timed per round")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pool-size", type=int, default=4, help="warm sandboxes, all hosts")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; median kept")
    args = parser.parse_args()

    daemon = TlsDaemon()
    try:
        print("# starting a TLS dockerd on loopback and loading the image", file=sys.stderr)
        daemon.start()
        daemon.load_image(DEFAULT_IMAGE)
        configs = {"local": [DockerHost()], "tls": [daemon.host()],
                   "local+tls": [DockerHost(), daemon.host()]}
        pools = {name: SandboxPool(size=args.pool_size, hosts=hosts).start()
                 for name, hosts in configs.items()}
        try:
            rates: dict[str, list[float]] = {name: [] for name in pools}
            names = list(pools)
            for round_ in range(args.rounds):
                # interleaved, so load changes hit every config, and the order rotates round
                # by round, so no config always goes first (or right after another's leases)
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:
                    rates[name].append(asyncio.run(
                        leases_per_second(pools[name], args.leases, args.concurrency)))
            split = Counter({n: s.leases for n, s in pools["local+tls"].stats.hosts.items()})
        finally:
            for pool in pools.values():
                pool.close()
    finally:
        daemon.remove()

    base = statistics.median(rates["local"])
    print(f"# {args.leases} leases x run('print(1)') per round, concurrency "
          f"{args.concurrency}, pool of {args.pool_size}, median of {args.rounds} rounds "
          "(order rotating)")
    print(f"# both daemons run on this machine and share its {os.cpu_count()} CPU cores: the "
          "ratio shows what routing over two hosts costs, not a speed-up")
    print(f"{'hosts':<10} {'leases/s':>9} {'vs local':>9}")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:<10} {median:>9.1f} {median / base:>8.2f}x")
    per_host = ", ".join(f"{n} {c}" for n, c in split.items())
    print(f"leases per host in local+tls, summed over its {args.rounds} rounds "
          f"({args.rounds * args.leases} leases): {per_host}")


if __name__ == "__main__":
    main()

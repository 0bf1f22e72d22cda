"""Sandbox benchmark shared by ``bench/sandbox_bench.py`` and ``agentgym sandbox bench``.

Every figure is measured in the run that prints it; nothing is hard-coded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentgym._errors import ConfigError

from ._config import DEFAULT_IMAGE, DockerSandboxConfig
from ._docker import container_options
from ._pool import SandboxPool
from ._verify import averify


@dataclass
class BenchResult:
    """Figures of one benchmark run (times in milliseconds unless named otherwise)."""

    warm_p50_ms: float
    warm_p95_ms: float
    warm_n: int
    cold_p50_ms: float
    cold_n: int
    execs_per_s: float
    pool_size: int
    humaneval_s: float | None
    humaneval_passed: int | None
    humaneval_n: int | None

    @property
    def ratio(self) -> float:
        """How many times faster a warm pooled run is than a cold hardened container."""
        return self.cold_p50_ms / self.warm_p50_ms

    def lines(self) -> list[str]:
        """Human-readable lines, one figure each."""
        out = [
            f"warm run('print(1)') via pool: p50 {self.warm_p50_ms:.1f} ms, "
            f"p95 {self.warm_p95_ms:.1f} ms (n={self.warm_n})",
            f"cold hardened containers.run: p50 {self.cold_p50_ms:.1f} ms (n={self.cold_n}, "
            "after one untimed run)",
            f"ratio cold/warm: {self.ratio:.0f}x",
            f"throughput: {self.execs_per_s:.0f} executions/s (pool of {self.pool_size})",
        ]
        if self.humaneval_s is not None:
            out.append(f"HumanEval verify: {self.humaneval_passed}/{self.humaneval_n} canonical "
                       f"solutions passed in {self.humaneval_s:.2f} s")
        return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def warm_latencies(pool: SandboxPool, n: int) -> list[float]:
    """Seconds per ``run("print(1)")`` on a leased warm sandbox (after 5 warm-up calls)."""
    with pool.lease() as sb:
        for _ in range(5):
            sb.run("print(1)")
        times = []
        for _ in range(n):
            t = time.perf_counter()
            result = sb.run("print(1)")
            times.append(time.perf_counter() - t)
            if result.stdout != "1\n":
                raise RuntimeError(f"benchmark run failed: {result}")
    return times


def cold_latencies(client: Any, image: str, config: DockerSandboxConfig, n: int) -> list[float]:
    """Seconds per hardened ``containers.run(..., remove=True)`` of ``print(1)``.

    One untimed run goes first, as the warm side's 5 warm-up calls do, so that neither side's
    figure holds a first call's costs (the client's connection, the image's files read in).
    The two sides are measured one after the other, not interleaved.
    """
    mine = f"cold-{os.getpid()}"  # this run's containers only
    opts = container_options(config, {"agentgym.bench": mine})
    times = []
    try:
        client.containers.run(image, ["python3", "-c", "print(1)"], remove=True, **opts)
        for _ in range(n):
            t = time.perf_counter()
            client.containers.run(image, ["python3", "-c", "print(1)"], remove=True, **opts)
            times.append(time.perf_counter() - t)
    finally:  # docker-py removes a container after it exits: a Ctrl-C before that left it
        for left in client.containers.list(all=True, filters={"label": f"agentgym.bench={mine}"}):
            with contextlib.suppress(Exception):  # 409: docker-py's own removal got there
                left.remove(force=True)
    return times


async def throughput(pool: SandboxPool, seconds: float) -> float:
    """Executions per second with every pooled sandbox busy running ``print(1)``."""
    count = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal count
        async with pool.alease() as sb:
            while time.perf_counter() < stop:
                await sb.arun("print(1)")
                count += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(pool.size)))
    return count / (time.perf_counter() - started)


def humaneval_cases(broken: bool = False) -> list[tuple[str, list[str]]]:
    """(code, tests) per HumanEval problem, tests as the env checks them (`hidden_tests`).

    ``broken`` replaces each body with ``pass``.
    """
    from agentgym.envs.humaneval import hidden_tests, load_problems

    return [
        (problem["prompt"] + ("    pass\n" if broken else problem["canonical_solution"]),
         hidden_tests(problem))
        for problem in load_problems()
    ]


async def verify_all(pool: SandboxPool, cases: list[tuple[str, list[str]]]) -> list[Any]:
    """`averify` every case through the pool, concurrently."""
    return await asyncio.gather(*(averify(code, tests, sandbox=pool, per_test_timeout=10.0)
                                  for code, tests in cases))


def run_bench(image: str = DEFAULT_IMAGE, pool_size: int = 4, n: int = 300, cold_n: int = 10,
              seconds: float = 3.0, humaneval: bool = True,
              log: Callable[[str], None] = lambda _: None) -> BenchResult:
    """Run every measurement and return the figures; `ConfigError` for counts below 1."""
    if n < 1 or cold_n < 1 or not seconds > 0:
        raise ConfigError(f"n (--n), cold_n and seconds must be >= 1, >= 1 and > 0, got {n}, "
                          f"{cold_n}, {seconds}")
    with SandboxPool(size=pool_size, image=image) as pool:
        log(f"pool of {pool_size} started; warm latency ({n} runs)")
        warm = warm_latencies(pool, n)
        log(f"cold hardened containers.run ({cold_n} runs)")
        cold = cold_latencies(pool._client, image, pool.config, cold_n)
        log(f"throughput ({seconds:g} s)")
        rate = asyncio.run(throughput(pool, seconds))
        he_s = he_passed = he_n = None
        if humaneval:
            cases = humaneval_cases()
            log(f"HumanEval: verifying {len(cases)} canonical solutions")
            t = time.perf_counter()
            results = asyncio.run(verify_all(pool, cases))
            he_s = time.perf_counter() - t
            he_passed, he_n = sum(r.passed for r in results), len(results)
    return BenchResult(
        warm_p50_ms=statistics.median(warm) * 1e3, warm_p95_ms=_percentile(warm, 0.95) * 1e3,
        warm_n=n, cold_p50_ms=statistics.median(cold) * 1e3, cold_n=cold_n,
        execs_per_s=rate, pool_size=pool_size, humaneval_s=he_s, humaneval_passed=he_passed,
        humaneval_n=he_n,
    )

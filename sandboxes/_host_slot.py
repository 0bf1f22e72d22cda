"""One Docker host's share of a `SandboxPool`: its warm sandboxes, counters, caps and clients.

The pool's lock guards everything here; this module only holds the per-host state and the two
caps (containers starting at once, creations per second), so the pool reads as the routing
between hosts.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from agentgym._errors import SandboxError

from ._docker import DockerSandbox
from ._hosts import DockerHost

HEALTH_TIMEOUT_S = 5.0  # a health check that takes longer counts as failed


@dataclass
class HostStats:
    """Counters of one Docker host of a pool (the same names as `PoolStats`, per host)."""

    created: int = 0
    recycled: int = 0
    leases: int = 0
    reap_removed: int = 0
    create_failures: int = 0
    marked_down: int = 0  # times the pool started routing around this host
    down: bool = False  # in its cool-off now: nothing is created or leased there


class TokenBucket:
    """At most ``rate`` grants per second on average, in bursts of up to ``max(1, rate)``.

    Each `take` reserves the next token at once (the count may go negative) and waits until
    that token is due, so callers are served in order without polling.
    """

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self._tokens = self.capacity
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def take(self, cancel: threading.Event) -> None:
        """Wait for a token; raise `SandboxError` if ``cancel`` is set meanwhile."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= 1
            wait = -self._tokens / self.rate
        if wait > 0 and cancel.wait(wait):
            raise SandboxError("the sandbox pool was closed")


class HostSlot:
    """One host's share of a pool; the pool's lock guards its counters and collections."""

    def __init__(self, host: DockerHost, size: int, max_starting: int,
                 creates_per_second: float | None, client: Any = None) -> None:
        self.host, self.size = host, size
        self.client = client  # for containers; connected at start (or when the host returns)
        self.owns_client = client is None
        self.health: Any = None  # a client with a short timeout, for health checks
        self.left_behind: set[str] = set()  # containers whose removal failed (host away)
        self.stats = HostStats()
        self.idle: deque[DockerSandbox] = deque()
        self.all: set[DockerSandbox] = set()
        self.creating = 0  # creations in flight (initial ones, replacements and refills)
        self.leased = 0
        self.last_lease = 0  # the pool's lease count when it last leased here: ties go to the
        # host chosen least recently, so episodes one after another spread over the hosts too
        self.retry_at = 0.0  # monotonic time its cool-off ends
        self.starting = threading.Semaphore(max_starting)
        self.bucket = TokenBucket(creates_per_second) if creates_per_second else None

    @property
    def down(self) -> bool:
        """In its cool-off now: nothing is created or leased there (kept in `stats`)."""
        return self.stats.down

    @property
    def short(self) -> int:
        """Sandboxes missing from its share (neither live nor being created)."""
        return self.size - len(self.all) - self.creating

    def connect(self) -> Any:
        """The container client, connected on first use."""
        if self.client is None:
            self.client = self.host.connect()
        return self.client

    def ping(self) -> None:
        """Raise when the daemon does not answer within `HEALTH_TIMEOUT_S`."""
        if self.health is None:
            self.health = self.host.connect(timeout=min(HEALTH_TIMEOUT_S, self.host.timeout))
        else:
            self.health.ping()

    def close_clients(self) -> None:
        """Close the HTTP connections this slot opened."""
        for client in ([self.client] if self.owns_client else []) + [self.health]:
            if client is not None:
                client.close()
        self.health = None
        if self.owns_client:
            self.client = None

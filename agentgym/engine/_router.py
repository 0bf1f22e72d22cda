"""`StickyLeastLoaded`: which replica serves an episode's next turn, decided on the client.

The policy is vllm-router's ``sticky_least_loaded``, for users who run N servers without a
router: an episode's first turn goes to the replica with the fewest requests in flight (ties to
the one chosen least recently, so a quiet run still spreads), and its later turns follow it
there, where its prefix is cached. Two traps peers hit are avoided on purpose:

- *Hash routing pins sessions to a saturated replica* (prime-rl PR #3255: prefix-cache hits
  98% -> 5%, ~4x slower, other replicas idle). Here a pinned episode moves when its replica has
  ``max_imbalance`` more requests in flight than the least loaded one: one lost prefix is
  cheaper than a queue.
- *Assignment counts that never go down* (verl #2520). Load is requests in flight, released
  when each request ends, whatever way it ends.

Pure bookkeeping, no I/O: `agentgym.engine.VLLMFleet` asks it and does the HTTP.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from .._errors import ConfigError, ModelError


@dataclass
class ReplicaState:
    """What the router knows of one server."""

    url: str
    in_flight: int = 0
    requests: int = 0  # requests routed here, in all
    sessions: set[str] = field(default_factory=set)  # episodes pinned here now
    down_until: float | None = None  # monotonic time; None while healthy
    down_reason: str = ""
    last_chosen: int = -1  # tick of the last choice, for the tie-break

    @property
    def healthy(self) -> bool:
        return self.down_until is None


@dataclass
class RouterStats:
    """Counters of one router (log them under ``router/``)."""

    sticky: int = 0  # turns that went where their episode's previous turn went
    placed: int = 0  # first turns placed on the least loaded replica
    moved: int = 0  # episodes moved off a replica (imbalance or failure)


class StickyLeastLoaded:
    """Sticky, least-loaded routing of episodes (sessions) over replicas.

    Args:
        urls: the replicas' base URLs.
        max_imbalance: requests in flight a pinned replica may have above the least loaded
            healthy one before its episode moves; 0 makes every turn least-loaded.
    """

    def __init__(self, urls: Sequence[str], max_imbalance: int = 8) -> None:
        if not urls:
            raise ConfigError("a router needs at least one server URL")
        if len(set(urls)) != len(urls):
            raise ConfigError(f"server URLs must be distinct, got {list(urls)}")
        if max_imbalance < 0:
            raise ConfigError(f"max_imbalance must be >= 0, got {max_imbalance}")
        self.replicas = {url: ReplicaState(url) for url in urls}
        self.max_imbalance = max_imbalance
        self.stats = RouterStats()
        self._pins: dict[str, str] = {}  # session -> url
        self._ticks = itertools.count()

    def choose(self, session: str | None) -> ReplicaState:
        """The replica for ``session``'s next request, counted in flight until `release`.

        Raises `ModelError` when no replica is healthy (the episode becomes ``infra_error``).
        """
        healthy = [r for r in self.replicas.values() if r.healthy]
        if not healthy:
            reasons = "; ".join(f"{r.url}: {r.down_reason}" for r in self.replicas.values())
            raise ModelError(f"no rollout server is up ({reasons})")
        least = min(healthy, key=lambda r: (r.in_flight, r.last_chosen))
        pinned = self.replicas.get(self._pins.get(session, "")) if session else None
        if pinned is not None and pinned.healthy:
            if pinned.in_flight - least.in_flight <= self.max_imbalance:
                self.stats.sticky += 1
                return self._take(pinned)
        if pinned is not None:
            self.stats.moved += 1
            pinned.sessions.discard(session or "")
        else:
            self.stats.placed += 1
        if session:
            self._pins[session] = least.url
            least.sessions.add(session)
        return self._take(least)

    def _take(self, replica: ReplicaState) -> ReplicaState:
        replica.in_flight += 1
        replica.requests += 1
        replica.last_chosen = next(self._ticks)
        return replica

    def release(self, replica: ReplicaState) -> None:
        """A request routed to ``replica`` ended (answered, failed or cancelled)."""
        replica.in_flight -= 1

    def finish(self, session: str) -> None:
        """The episode ended: forget where it was pinned."""
        url = self._pins.pop(session, None)
        if url is not None:
            self.replicas[url].sessions.discard(session)

    def mark_down(self, url: str, reason: str, cool_off: float) -> None:
        """Route around ``url`` for ``cool_off`` seconds; its episodes move on their next turn."""
        replica = self.replicas[url]
        replica.down_until = time.monotonic() + cool_off
        replica.down_reason = reason

    def mark_up(self, url: str) -> None:
        """``url`` takes traffic again (call only once it serves the current adapter)."""
        replica = self.replicas[url]
        replica.down_until, replica.down_reason = None, ""

    def healthy_urls(self) -> list[str]:
        """The replicas taking traffic now."""
        return [r.url for r in self.replicas.values() if r.healthy]

    def due_for_probe(self) -> list[ReplicaState]:
        """Down replicas whose cool-off has passed: probe them before they take traffic."""
        now = time.monotonic()
        return [
            r for r in self.replicas.values() if r.down_until is not None and r.down_until <= now
        ]

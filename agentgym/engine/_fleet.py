"""`VLLMFleet`: N OpenAI-compatible vLLM servers used as one rollout engine.

Two planes, as in SkyRL and prime-rl:

- *Data plane*: each request goes to the replica `StickyLeastLoaded` picks (an episode stays
  where its prefix is cached). A replica that fails in transit or answers 5xx is routed around
  for ``cool_off`` seconds; after that it is probed (in the background past ``probe_wait``
  while another server is up), and it takes traffic again only once it serves every adapter
  version the fleet keeps (a restarted server comes back empty).
- *Control plane*: `publish` loads a new adapter version on every healthy server at once
  (``/v1/load_lora_adapter``; the servers need ``--enable-lora`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``), retrying "not found" while shared storage catches
  up. Traffic switches to the new version only when every healthy server acknowledged;
  otherwise it is unloaded where it was loaded and `AdapterPublishError` fails the step. A
  server that cannot be reached at all is marked down instead (it gets the version when it
  comes back), so one dead server does not stop a run. The newest ``keep_versions`` are kept
  loaded, so requests still in flight on the previous one finish on it.

Why not let the servers' own router fan the load out: vllm-router forwards requests, not
adapter loads, and a load that reached one replica is the bug peers ship (TRL refuses adapter
sync with DP > 1 for that reason). Adapter names carry the version (``agentgym-v7``): vLLM
refuses to reload a name, and keys its prefix cache by adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import ConfigError, ModelError
from .._http import LoopClient
from .._run_to_end import run_to_end
from ._episode import AdapterVersion
from ._router import ReplicaState, StickyLeastLoaded

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)
#: What vLLM answers while an adapter folder is not (yet) visible on its storage.
_NOT_FOUND_HINTS = ("not found", "does not exist", "no such file", "no adapter", "cannot find")


#: What a server without the runtime adapter API lacks, and the fix.
NO_ADAPTER_API = (
    "has no /v1/load_lora_adapter: start it with --enable-lora and "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"
)


class AdapterPublishError(ModelError):
    """A new adapter version did not reach every server; it was unloaded where it was loaded."""


def run_namespace(run_id: str) -> str:
    """The adapter namespace of one process of run ``run_id``: its id and a fresh suffix.

    Why fresh per process: a run killed and resumed redoes its steps from the checkpoint, and
    under the same names the servers (which skip a name they serve) and the adapter storage
    (which reuses a staged folder) would serve the killed process's weights as the resumed
    run's versions, silently.
    """
    return f"{run_id}.{secrets.token_hex(3)}"


def _earlier_processes_adapters(namespace: str, names: set[str]) -> list[str]:
    """Of ``names``, the adapters of other processes of ``namespace``'s run (a killed one's).

    Why: nothing else ever unloads them (their process is gone), so every ``kill -9`` and
    resume left two versions on each long-lived server, holding its ``--max-loras`` slots.
    Other runs' adapters are never matched: they may be live.
    """
    run_id, dot, _ = namespace.rpartition(".")
    if not dot:
        return []
    earlier = re.compile(rf"agentgym-{re.escape(run_id)}\.[0-9a-f]{{6}}-v\d+")
    ours = f"agentgym-{namespace}-v"
    return sorted(n for n in names if earlier.fullmatch(n) and not n.startswith(ours))


def adapter_name(version: int, namespace: str = "") -> str:
    """The served name of adapter ``version`` (``agentgym-v7``, or ``agentgym-<ns>-v7``)."""
    return f"agentgym-{namespace}-v{version}" if namespace else f"agentgym-v{version}"


def server_root(url: str) -> str:
    """``http://host:port`` from a server URL given with or without ``/v1``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True)
class PublishReport:
    """How one `publish` went: the version, where it is served, and how long it took."""

    version: int
    servers: tuple[str, ...]
    down: tuple[str, ...]  # unreachable servers, marked down (they load it when they return)
    seconds: float


class VLLMFleet:
    """N vLLM servers (one replica each) behind a client-side sticky least-loaded router.

    Args:
        servers: the servers' URLs (``http://host:port`` or ``.../v1``).
        model: the base model's served name (``--served-model-name``).
        api_key: sent as a bearer token when given.
        timeout: seconds per request.
        max_imbalance: see `StickyLeastLoaded`.
        cool_off: seconds a failed server is routed around before it is probed again.
        probe_wait: seconds a request waits for such a probe while another server is up; a
            longer probe (a host that does not answer, adapters slow to load) goes on in the
            background and the request goes to a healthy server.
        load_timeout: seconds to keep retrying an adapter load that answers "not found".
        keep_versions: adapter versions kept loaded on every server (``max_staleness + 1``;
            the servers' ``--max-loras`` must be above this).
        namespace: part of every adapter name (a run's id), so a new run on long-lived
            servers never meets an old run's ``v1`` under the same name.
    """

    def __init__(
        self,
        servers: Sequence[str],
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_imbalance: int = 8,
        cool_off: float = 5.0,
        probe_wait: float = 1.0,
        load_timeout: float = 120.0,
        keep_versions: int = 2,
        namespace: str = "",
    ) -> None:
        if keep_versions < 1:
            raise ConfigError(f"keep_versions must be >= 1, got {keep_versions}")
        self.urls = [server_root(u) for u in servers]
        self.router = StickyLeastLoaded(self.urls, max_imbalance)
        self.model = model
        self.cool_off = cool_off
        self.probe_wait = probe_wait
        self.load_timeout = load_timeout
        self.keep_versions = keep_versions
        self.namespace = namespace
        #: Adapter versions every healthy server serves, oldest first.
        self.adapters: list[AdapterVersion] = []
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        #: The connection pool of both planes (requests carry the bearer token, if any).
        self.http = LoopClient(headers=headers, timeout=timeout)
        #: Adapter loads retried because a server did not see the folder yet (shared storage lag).
        self.not_found_retries = 0
        #: The probe of each server being probed, by URL, until it ends (however it ends).
        self._probes: dict[str, asyncio.Task[None]] = {}

    @property
    def adapter_version(self) -> int:
        """The version new requests sample with (0: the base model)."""
        return self.adapters[-1].version if self.adapters else 0

    def metrics(self) -> dict[str, float]:
        """Routing counters to log each step (``router/...``), since the fleet was made.

        Sticky, placed and moved turns, servers up, adapter loads retried because shared
        storage lagged (`not_found_retries`), and requests per server (`urls` order).
        """
        replicas = [self.router.replicas[url] for url in self.urls]
        stats = self.router.stats
        return {
            "router/sticky_turns": float(stats.sticky),
            "router/placed_episodes": float(stats.placed),
            "router/moved_episodes": float(stats.moved),
            "router/servers_up": float(sum(r.healthy for r in replicas)),
            "router/not_found_retries": float(self.not_found_retries),
            **{f"router/requests_server{k}": float(r.requests) for k, r in enumerate(replicas)},
        }

    def served_name(self, version: int) -> str:
        """The ``model`` field of a request for ``version``."""
        return self.model if version == 0 else adapter_name(version, self.namespace)

    def version_of(self, name: str) -> int | None:
        """The version served as ``name`` (0: the base model).

        None for a name of no version of this run (another run's namespace, another model).
        """
        if name == self.model:
            return 0
        prefix = adapter_name(0, self.namespace)[: -len("0")]
        number = name[len(prefix) :] if name.startswith(prefix) else ""
        return int(number) if number.isascii() and number.isdigit() else None

    # ---- data plane ---------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def replica(self, session: str | None) -> AsyncIterator[ReplicaState]:
        """A replica for one request of ``session``, counted in flight while the block runs."""
        await self._probe_due()
        chosen = self.router.choose(session)
        try:
            yield chosen
        finally:
            self.router.release(chosen)

    def mark_down(self, url: str, reason: str) -> None:
        """Route around ``url`` until it answers a probe and serves the kept adapters."""
        log.warning("rollout server %s is down: %s", url, reason)
        self.router.mark_down(url, reason, self.cool_off)

    def finish_session(self, session: str) -> None:
        """The episode ended: its pin is forgotten."""
        self.router.finish(session)

    async def _probe_due(self) -> None:
        """Bring back down servers whose cool-off passed, once they serve the kept adapters.

        A request waits for the probes at most ``probe_wait`` seconds while a server is up:
        awaited to the end, one turn per cool-off waited out a dead host's whole ``timeout``
        (and a slow adapter load's ``load_timeout``) although a healthy server was free.
        """
        due = [r.url for r in self.router.due_for_probe() if r.url not in self._probes]
        started = [self._start_probe(url) for url in due]
        if not self.router.healthy_urls():  # nowhere else to go: wait for every probe
            started = self._probes_here()
            if started:
                await asyncio.wait(started)
        elif started:
            await asyncio.wait(started, timeout=self.probe_wait)

    def _probes_here(self) -> list[asyncio.Task[None]]:
        """The probes running on this event loop (a fleet may serve several, one at a time)."""
        loop = asyncio.get_running_loop()
        return [t for t in self._probes.values() if t.get_loop() is loop]

    def _start_probe(self, url: str) -> asyncio.Task[None]:
        """`_rejoin` ``url`` in a task; it counts as probing until the task ends, however."""
        task = self._probes[url] = asyncio.ensure_future(self._rejoin(url))  # no second one
        task.add_done_callback(lambda _: self._probes.pop(url, None))  # cancelled unstarted too
        return task

    async def _rejoin(self, url: str) -> None:
        try:
            await self._load_kept(url, await self.served_names(url))
        except (ModelError, OSError) as exc:
            self.router.mark_down(url, f"probe failed: {exc}", self.cool_off)
        else:
            log.info("rollout server %s is back (serves v%d)", url, self.adapter_version)
            self.router.mark_up(url)

    async def _load_kept(self, url: str, served: set[str]) -> None:
        """Load every kept version ``url`` lacks, until none is missing.

        Why a loop: a publish can finish while these loads run; a server that rejoined with
        only the versions it saw at the start would take traffic for one it does not serve.
        """
        while missing := [a for a in self.adapters if a.name not in served]:
            for adapter in missing:
                await self._load(url, adapter.name, adapter.path)
                served.add(adapter.name)

    # ---- control plane ------------------------------------------------------------------
    async def served_names(self, url: str) -> set[str]:
        """Model and adapter names ``url`` serves now (``/v1/models``)."""
        import httpx

        try:
            response = await self.http.get().get(f"{url}/v1/models")
        except httpx.TransportError as exc:
            raise ModelError(f"{url} is unreachable: {exc!r}") from exc
        if response.status_code != 200:
            raise ModelError(f"{url}/v1/models answered {response.status_code}")
        try:  # a proxy's error page or a cut answer: the server is as good as unreachable
            return {str(entry["id"]) for entry in response.json()["data"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"{url}/v1/models answered {response.text[:200]!r}") from exc

    async def serves_adapters(self, url: str) -> bool:
        """Whether ``url`` has the runtime adapter API (``/v1/load_lora_adapter``).

        A GET answers 405 where the POST route exists and the framework's bare 404 where vLLM
        was started without ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``; nothing is loaded.
        """
        import httpx

        try:
            response = await self.http.get().get(f"{url}/v1/load_lora_adapter")
        except httpx.TransportError as exc:
            raise ModelError(f"{url} is unreachable: {exc!r}") from exc
        return not _no_lora_route(response)

    async def served_versions(self) -> dict[str, set[int]]:
        """Adapter versions each healthy server reports loaded (to check a publish)."""
        healthy = self.router.healthy_urls()
        names = await asyncio.gather(*(self.served_names(url) for url in healthy))
        known = {a.name: a.version for a in self.adapters}
        return {
            url: {known[n] for n in served if n in known} for url, served in zip(healthy, names)
        }

    async def publish(self, path: str | os.PathLike[str], version: int) -> PublishReport:
        """Load adapter folder ``path`` as ``version`` on every healthy server, or on none.

        ``path`` must be readable by every server under the same name (shared storage; see
        `stage_adapter`). Raises `AdapterPublishError` when a server refused it (after
        unloading it from the others) and `ConfigError` for a version not above the last.

        A cancelled caller waits for the publish to end (recorded, or unloaded again) before
        its cancellation goes on. Why: a server finishes a load whatever its client does, so a
        publish cut mid-gather left the version on servers without the fleet knowing (nothing
        ever unloaded it), and the next publish reused its number, which those servers skipped
        as served already: old weights under the new version's name.
        """
        if version <= self.adapter_version:
            raise ConfigError(
                f"adapter version {version} is not above the last one published "
                f"({self.adapter_version}); every version needs a fresh number"
            )
        return await run_to_end(self._publish(path, version))

    async def _publish(self, path: str | os.PathLike[str], version: int) -> PublishReport:
        """`publish`'s loads, then the switch to ``version`` or the roll-back."""
        name, started = self.served_name(version), time.perf_counter()
        targets = self.router.healthy_urls()
        results = await asyncio.gather(
            *(self._load_once(url, name, str(path)) for url in targets), return_exceptions=True
        )
        loaded, down, refused = [], [], []
        for url, result in zip(targets, results):
            if result is None:
                loaded.append(url)
            elif isinstance(result, _Unreachable):
                down.append(url)
                self.mark_down(url, str(result))
            elif isinstance(result, Exception):
                refused.append(f"{url}: {result}")
            else:
                raise result  # cancellation and other BaseExceptions go on up
        if refused or not loaded:
            await asyncio.gather(*(self._unload(url, name) for url in loaded))
            why = "; ".join(refused) or "no server is reachable"
            raise AdapterPublishError(f"adapter v{version} was not published ({why})")
        self.adapters.append(
            AdapterVersion(version, name, str(path), time.perf_counter() - started)
        )
        self._reprobe_joined_during(targets, version)
        await self._retire_old()
        return PublishReport(version, tuple(loaded), tuple(down), self.adapters[-1].load_seconds)

    def _reprobe_joined_during(self, targets: list[str], version: int) -> None:
        """Send servers that came back while ``version`` was loading through a probe again.

        They rejoined with the versions kept before it, so new traffic on ``version`` would
        meet a server without it; the probe (due at once) loads it before they take traffic.
        """
        for url in self.router.healthy_urls():
            if url not in targets:
                self.router.mark_down(url, f"rejoined while v{version} was published", 0.0)

    async def _retire_old(self) -> None:
        """Unload versions beyond ``keep_versions`` from every healthy server."""
        old, self.adapters = (
            self.adapters[: -self.keep_versions],
            self.adapters[-self.keep_versions :],
        )
        healthy = self.router.healthy_urls()
        await asyncio.gather(*(self._unload(url, a.name) for a in old for url in healthy))

    async def _load_once(self, url: str, name: str, path: str) -> None:
        """Load ``name`` on ``url`` unless it serves it already.

        Another trainer rank may have published this version a moment ago: the name holds the
        run's namespace and the version, so serving it means serving these weights. A load
        is checked in the server's model list afterwards: an acknowledgement alone does not
        switch traffic (a server that said yes and kept its old adapters would serve them).
        """
        if name in await self._names_or_unreachable(url):
            return
        await self._load(url, name, path)
        if name not in await self._names_or_unreachable(url):
            raise ModelError(f"{url} acknowledged loading {name} but does not serve it")

    async def _names_or_unreachable(self, url: str) -> set[str]:
        try:
            return await self.served_names(url)
        except ModelError as exc:
            raise _Unreachable(str(exc)) from exc

    async def _load(self, url: str, name: str, path: str) -> None:
        """Load ``name`` on ``url``, retrying "not found" until ``load_timeout`` has passed."""
        import httpx

        body = {"lora_name": name, "lora_path": path}
        deadline, backoff = time.monotonic() + self.load_timeout, 0.1
        while True:
            try:
                response = await self.http.get().post(f"{url}/v1/load_lora_adapter", json=body)
            except httpx.TransportError as exc:
                raise _Unreachable(f"{url} is unreachable: {exc!r}") from exc
            text = response.text
            if response.status_code == 200 or "already been loaded" in text:
                return
            if _no_lora_route(response):
                raise ModelError(f"{url} {NO_ADAPTER_API}")
            missing = any(hint in text.lower() for hint in _NOT_FOUND_HINTS)
            if not missing or time.monotonic() + backoff > deadline:
                raise ModelError(f"loading {name} answered {response.status_code}: {text[:300]}")
            self.not_found_retries += 1
            await asyncio.sleep(backoff)  # shared storage has not caught up yet: back off
            backoff = min(backoff * 2, 5.0)

    async def unload_earlier_processes(self, url: str, served: set[str]) -> list[str]:
        """Unload from ``url`` the versions of this run's earlier processes among ``served``."""
        stale = _earlier_processes_adapters(self.namespace, served)
        await asyncio.gather(*(self._unload(url, name) for name in stale))
        return stale

    async def unload_published(self) -> None:
        """Unload every version this fleet keeps from every healthy server: its run is over.

        A run's last versions otherwise stayed loaded until the server restarted.
        """
        names, self.adapters = [a.name for a in self.adapters], []
        urls = self.router.healthy_urls()
        await asyncio.gather(*(self._unload(url, name) for url in urls for name in names))

    async def _unload(self, url: str, name: str) -> None:
        """Unload ``name`` from ``url``; a failure is logged (the server may be gone)."""
        import httpx

        try:
            response = await self.http.get().post(
                f"{url}/v1/unload_lora_adapter", json={"lora_name": name}
            )
            if response.status_code not in (200, 404):  # 404: unloaded already (another rank)
                log.warning("unloading %s on %s answered %s", name, url, response.status_code)
        except httpx.TransportError as exc:
            log.warning("unloading %s on %s failed: %r", name, url, exc)

    async def aclose(self) -> None:
        """Stop this loop's probes and close the HTTP connection pool (it reopens on demand).

        A stopped probe leaves its server down and due: the next request probes it again.
        """
        here = self._probes_here()
        for task in here:
            task.cancel()
        await asyncio.gather(*here, return_exceptions=True)
        await self.http.aclose()


class _Unreachable(ModelError):
    """A server did not answer at all (as opposed to refusing)."""


def _no_lora_route(response: httpx.Response) -> bool:
    """Whether the server has no runtime adapter API at all (the web framework's bare 404).

    vLLM's own "adapter not found" is an error object; this one would otherwise pass for
    shared storage lagging and be retried for ``load_timeout`` seconds.
    """
    if response.status_code != 404:
        return False
    try:
        return bool(response.json() == {"detail": "Not Found"})
    except ValueError:
        return False


def stage_adapter(
    source: str | os.PathLike[str], shared_dir: str | os.PathLike[str], version: int,
    namespace: str = "",
) -> Path:  # fmt: skip
    """Copy adapter folder ``source`` to ``shared_dir/<adapter name>``, atomically.

    The copy is written under a temporary name and renamed into place, so a server never
    reads a half-written adapter; a rename is atomic on one filesystem (NFS included).
    Returns the final path; it exists already when this version was staged before (resume).
    """
    final = Path(shared_dir) / adapter_name(version, namespace)
    if final.is_dir():
        return final
    staging = Path(shared_dir) / f".{final.name}.{uuid.uuid4().hex}.tmp"
    shutil.copytree(source, staging)
    try:
        os.rename(staging, final)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not final.is_dir():  # a concurrent stager won the rename: that copy serves
            raise
    return final

"""Sandboxes on several Docker hosts: the local daemon plus a second one over mutual TLS.

The second daemon (`tls_daemon` in conftest) is a real ``dockerd --tlsverify`` on loopback,
so routing, TLS, caps, reaping and a host dying are exercised for real, not mocked.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agentgym import ScriptedPolicy, rollout, tool
from agentgym._errors import ConfigError, SandboxError
from agentgym.sandboxes import (
    DockerHost,
    DockerSandbox,
    DockerSandboxConfig,
    Sandbox,
    SandboxPool,
    SandboxToolEnv,
    _reap,
    close_shared_pools,
)
from tests.sandboxes.tls_daemon import make_certs

BOTH = ("local", "tls")


def bounded(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``, failing the test instead of hanging if it takes longer than ``seconds``."""
    runner = ThreadPoolExecutor(1)
    try:
        return runner.submit(fn).result(timeout=seconds)
    finally:
        runner.shutdown(wait=False)


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll ``condition`` (a pool's state, changed by its own threads) under a deadline."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds}s: {what}"
        time.sleep(0.05)


def pool_containers(client: Any, pool: SandboxPool) -> set[str]:
    """Ids of ``pool``'s containers on ``client``'s daemon."""
    return {c.id for c in client.containers.list(
        all=True, filters={"label": f"{_reap.POOL}={pool.pool_id}"})}


# -- configuration -------------------------------------------------------------------------
def _bad_configs(tmp_path: Path) -> list[tuple[Callable[[], Any], str]]:
    pem = tmp_path / "ca.pem"
    pem.write_text("not read before connecting\n")
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: DockerHost("http://10.0.0.5:2375"), "unix://, tcp:// or ssh://"),
        (lambda: DockerHost("tcp://10.0.0.5:2375"), "mutual TLS"),
        (lambda: DockerHost("tcp://10.0.0.5:2376", ca_cert=str(pem)), "all three"),
        (lambda: DockerHost.from_cert_dir("tcp://10.0.0.5:2376", tmp_path), "does not exist"),
        (lambda: DockerHost("unix:///run/docker.sock", ca_cert=str(pem)), "tcp:// only"),
        (lambda: DockerHost(timeout=0), "timeout must be > 0"),
        (lambda: SandboxPool(hosts=["unix:///a.sock", "unix:///a.sock"]), "unique"),
        (lambda: SandboxPool(size=1, hosts=["unix:///a.sock", "unix:///b.sock"]),
         "got 2: raise size or give fewer hosts"),
        (lambda: SandboxPool(hosts=[], size=2), "1 to size=2"),
        (lambda: SandboxPool(hosts=[DockerHost()], client=object()), "not both"),
        (lambda: SandboxPool(max_creates_per_second=0), "max_creates_per_second"),
        (lambda: DockerSandboxConfig(max_lifetime_s=0), "max_lifetime_s"),
    ]
    if importlib.util.find_spec("paramiko") is None:  # the extra docker-py needs for ssh
        cases.append((lambda: DockerHost("ssh://agent@10.0.0.6"), "pip install 'docker[ssh]'"))
    return cases


def test_bad_host_config_is_a_one_line_config_error(tmp_path):
    for make, fix in _bad_configs(tmp_path):
        with pytest.raises(ConfigError) as info:
            make()
        message = str(info.value)
        assert fix in message and "\n" not in message, message


def test_host_names_and_loopback_tcp():
    assert DockerHost().name == "local" and DockerHost().url is None
    assert DockerHost("tcp://127.0.0.1:2375").name == "127.0.0.1:2375"  # loopback: TLS optional
    assert DockerHost("tcp://localhost:2375", name="dev").name == "dev"
    assert DockerHost.parse("unix:///run/docker.sock") == DockerHost("unix:///run/docker.sock")


# -- the TLS daemon beside the local one ---------------------------------------------------
@pytest.mark.docker
@pytest.mark.slow
def test_tls_host_serves_the_same_pool_as_the_local_one(tls_host):
    tls_client = tls_host.connect()
    with SandboxPool(size=4, hosts=[DockerHost(), tls_host]) as pool:
        assert [h.name for h in pool.hosts] == list(BOTH)
        with contextlib.ExitStack() as stack:
            leases = [stack.enter_context(pool.lease(timeout=30)) for _ in range(4)]
            assert Counter(sb.host.name for sb in leases) == {"local": 2, "tls": 2}
            for sb in leases:
                assert sb.run(f"print(6 * 7, {sb.host.name!r})").stdout == f"42 {sb.host.name}\n"
            on_tls = {sb.container_id for sb in leases if sb.host.name == "tls"}
            assert on_tls == pool_containers(tls_client, pool)  # really on the other daemon
        one_after_another = []
        for _ in range(4):  # nothing out between leases: ties go to the host used least lately
            wait_for(lambda: pool.idle == 4, 30, "the returned sandboxes were reset")
            with pool.lease(timeout=30) as sb:
                one_after_another.append(sb.host.name)
        assert one_after_another == ["local", "tls"] * 2
        per_host = pool.stats.hosts
        assert [per_host[n].created for n in BOTH] == [2, 2]
        assert [per_host[n].leases for n in BOTH] == [4, 4] and pool.stats.leases == 8
    assert pool_containers(tls_client, pool) == set()


@pytest.mark.docker
@pytest.mark.slow
def test_requests_ca_bundle_does_not_break_tls(tls_host, tmp_path, monkeypatch):
    make_certs(tmp_path)  # an unrelated CA: a bundle that cannot verify the daemon
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("CURL_CA_BUNDLE", str(tmp_path / "ca.pem"))
    import docker  # the fixtures made sure it is there

    # the trap is live: docker-py's own client lets requests swap the daemon's CA for the bundle
    with pytest.raises(docker.errors.DockerException, match="CERTIFICATE_VERIFY_FAILED"):
        docker.DockerClient(base_url=tls_host.url, tls=tls_host._tls_config())
    with DockerSandbox(host=tls_host) as sb:
        assert sb.run("print('over tls')").stdout == "over tls\n"


@pytest.mark.docker
@pytest.mark.slow
def test_reaper_removes_leaked_containers_on_the_remote_host(tls_host):
    import docker  # the fixtures made sure it is there

    client = tls_host.connect()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid is now a dead owner
    dead_owner = {**_reap.ownership_labels(), _reap.OWNER: str(child.pid)}
    other_machine = {**_reap.ownership_labels(), _reap.HOST: "another-machine"}
    wedged = {**other_machine, _reap.EXPIRES: f"{time.time() - 1:.3f}"}  # live owner, expired
    made = {name: client.containers.create("agentgym-sandbox:py3", "true", labels=labels).id
            for name, labels in (("dead", dead_owner), ("wedged", wedged),
                                 ("live", other_machine))}
    try:
        with SandboxPool(size=2, hosts=[DockerHost(), tls_host]) as pool:
            assert pool.stats.hosts["tls"].reap_removed == 2
        left = {c.id for c in _reap.managed_containers(client)}
        assert made["dead"] not in left and made["wedged"] not in left
        assert made["live"] in left, "a live owner's unexpired container was reaped"
    finally:
        for container_id in made.values():
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(container_id, force=True)


@pytest.mark.docker
@pytest.mark.slow
def test_create_rate_cap_holds(docker_ready):
    rate, n = 1.0, 4  # bucket of max(1, rate) = 1 token: n creates need (n - 1) / rate seconds
    started = time.monotonic()
    with SandboxPool(size=n, max_creates_per_second=rate, max_concurrent_creates=n) as pool:
        took = time.monotonic() - started
        client = pool.hosts[0].connect()
        created = sorted(datetime.fromisoformat(client.api.inspect_container(c)["Created"])
                         .timestamp() for c in pool_containers(client, pool))
    assert took >= (n - 1) / rate, f"{n} creates in {took:.2f}s"
    assert len(created) == n
    # the daemon saw them spaced too (not just a slow start): allow its clock 0.3 s of jitter
    assert created[-1] - created[0] >= (n - 1) / rate - 0.3, created


@pytest.mark.docker
@pytest.mark.slow
def test_a_sandbox_near_its_expiry_is_replaced_not_reused(docker_ready, monkeypatch):
    # Its labels say an hour, so no other process's reaper removes it mid-test (with
    # max_lifetime_s=0.001 another xdist worker's pool start did); this process reads every
    # expiry as a second away: a tenth of the lifetime is left, so it is expiring, not expired.
    from agentgym.sandboxes import _reap

    monkeypatch.setattr(_reap, "expires_at", lambda labels: time.time() + 1.0)
    config = DockerSandboxConfig(max_lifetime_s=3600)
    with SandboxPool(size=1, config=config) as pool:
        ids = []
        for _ in range(2):
            with pool.lease(timeout=30) as sb:
                assert sb.expiring and sb.run("print(1)").ok
                ids.append(sb.container_id)
        assert ids[0] != ids[1] and pool.stats.recycled >= 1


# -- a host dying mid-run -------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.slow
# 300 s (was 120): 13 s idle with the TLS daemon's start (its fixture's setup counts too),
# which a saturated machine 10x slower in bursts could stretch past two minutes
@pytest.mark.timeout(300)
def test_a_pool_over_both_survives_the_tls_host_stopping(tls_daemon, tls_host):
    tls_client = tls_host.connect()
    pool = SandboxPool(size=4, hosts=[DockerHost(), tls_host], health_interval_s=0.2,
                       host_cooloff_s=1.0).start()
    try:
        with contextlib.ExitStack() as stack:
            held = {}
            for _ in range(4):
                sb = stack.enter_context(pool.lease(timeout=30))
                held[sb.host.name] = sb
            stale = pool_containers(tls_client, pool)
            tls_daemon.stop()
            lost = bounded(30, lambda: held["tls"].run("print(1)", timeout=5))
            assert lost.status == "infra_error", lost
            with pytest.raises(SandboxError):
                bounded(30, lambda: held["tls"].snapshot(timeout=5))
            assert held["local"].run("print(2)").stdout == "2\n"
            ending = time.monotonic()
        assert time.monotonic() - ending < 10, "ending leases waited on the dead host"
        wait_for(lambda: pool.stats.hosts["tls"].down, 10, "the TLS host marked down")

        def lease_and_run() -> str:
            with pool.lease(timeout=20) as sb:
                assert sb.run("print(3)").stdout == "3\n"
                return sb.host.name
        assert {bounded(30, lease_and_run) for _ in range(6)} == {"local"}

        tls_daemon.start()  # it comes back: the pool refills it and cleans up after the cut
        wait_for(lambda: not pool.stats.hosts["tls"].down and pool.idle == 4, 30,
                 "the TLS host back and refilled")
        with contextlib.ExitStack() as stack:
            again = [stack.enter_context(pool.lease(timeout=30)) for _ in range(4)]
            assert Counter(sb.host.name for sb in again) == {"local": 2, "tls": 2}
            live_on_tls = {sb.container_id for sb in again if sb.host.name == "tls"}
            assert pool_containers(tls_client, pool) == live_on_tls
            assert not stale & live_on_tls
        assert pool.stats.hosts["tls"].marked_down >= 1
    finally:
        pool.close()


@pytest.mark.docker
@pytest.mark.slow
def test_a_host_down_at_start_is_routed_around_then_joins(tls_daemon, tls_host):
    nowhere = [DockerHost("tcp://127.0.0.1:1"), DockerHost("unix:///nonexistent/docker.sock")]
    with pytest.raises(SandboxError, match="failed to start on every host"):
        bounded(30, SandboxPool(size=2, hosts=nowhere).start)
    tls_daemon.stop()
    with SandboxPool(size=4, hosts=[DockerHost(), tls_host], health_interval_s=0.2,
                     host_cooloff_s=0.5) as pool:
        assert pool.stats.hosts["tls"].down and pool.idle == 2
        with pool.lease(timeout=30) as sb:
            assert sb.host.name == "local"
        tls_daemon.start()
        wait_for(lambda: pool.idle == 4, 30, "the TLS host joined and filled its share")
        assert not pool.stats.hosts["tls"].down and pool.stats.hosts["tls"].created == 2


@tool
async def where(sandbox: Sandbox) -> str:
    """Say which host runs this sandbox."""
    return str(sandbox.host.name)  # type: ignore[attr-defined]  # the lease's DockerSandbox


@pytest.mark.docker
@pytest.mark.slow
def test_a_sandbox_env_spreads_its_episodes_over_hosts_named_in_a_config(tls_daemon, tls_host):
    tls = {"url": tls_daemon.url, "cert_dir": str(tls_daemon.certs), "name": "tls"}
    local = {"url": "unix:///var/run/docker.sock", "name": "local"}
    hosts = [local, tls]  # as a YAML config gives them
    call = '<tool_call>{"name": "where", "arguments": {}}</tool_call>'
    envs: list[SandboxToolEnv] = []

    def make_env() -> SandboxToolEnv:
        envs.append(SandboxToolEnv([where], tasks=[{"prompt": "where?"}] * 4, pool_size=4,
                                   sandbox_hosts=hosts, lease_timeout=60))  # fmt: skip
        return envs[-1]

    try:
        trajectories = rollout(
            make_env, ScriptedPolicy([call, "done"]), tasks=list(range(4)), max_concurrency=4
        )
    finally:
        close_shared_pools()
    assert [t.status for t in trajectories] == ["ok"] * 4, trajectories[0].error
    answers = Counter(t.messages[3]["content"] for t in trajectories)
    assert set(answers) == set(BOTH), answers  # four episodes at once: both hosts served
    pool = envs[-1].pool
    assert pool is not None and all(pool.stats.hosts[name].leases >= 1 for name in BOTH)
    assert len({id(env.pool) for env in envs if env.pool is not None}) == 1  # one shared pool


@pytest.mark.docker
@pytest.mark.slow
def test_sandbox_ls_and_prune_look_at_a_remote_host(tls_daemon, tls_host):
    from typer.testing import CliRunner

    from agentgym.sandboxes._cli import app

    remote = ["--host", tls_daemon.url, "--cert-dir", str(tls_daemon.certs)]
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid is now a dead owner
    labels = {**_reap.ownership_labels(), _reap.OWNER: str(child.pid)}
    leaked = tls_host.connect().containers.create("agentgym-sandbox:py3", "true", labels=labels)
    listed = CliRunner().invoke(app, ["ls", *remote])
    assert listed.exit_code == 0 and leaked.short_id in listed.output, listed.output
    local = CliRunner().invoke(app, ["ls"])
    assert leaked.short_id not in local.output  # the default daemon does not have it
    pruned = CliRunner().invoke(app, ["prune", *remote])
    assert pruned.exit_code == 0 and leaked.short_id in pruned.output, pruned.output
    assert leaked.id not in {c.id for c in _reap.managed_containers(tls_host.connect())}
    bad = CliRunner().invoke(app, ["ls", "--host", "tcp://10.1.2.3:2375"])
    # plain tcp off loopback: refused, a ConfigError (`agentgym` prints it in one line, exit 2)
    assert isinstance(bad.exception, ConfigError) and "TLS" in str(bad.exception)

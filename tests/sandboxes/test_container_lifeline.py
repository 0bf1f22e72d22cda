"""A plain script's containers go with it when SIGTERM (no handler) or SIGKILL ends it.

Why: Python runs no atexit hook on a signal's default action, so a `SandboxPool` in a
script stopped by ``kill``, ``docker stop``, Kubernetes or Slurm left its containers running
until the next pool start or ``agentgym sandbox prune``. Each container's keeper now reads
a stdin only the owner process holds open (`DockerSandbox._attach_lifeline`), so the
container stops when the owner ends, and the daemon removes it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from agentgym.sandboxes import _reap
from agentgym.sandboxes._client import docker_client
from tests.sandboxes.conftest import require_docker

pytestmark = pytest.mark.docker

#: Seconds the test allows for the daemon to stop and remove them (it takes well under one).
BOUND_S = 20.0

CHILD = r"""
import sys
from agentgym.sandboxes import SandboxPool
pool = SandboxPool(size=2).start()
with pool.lease() as sb:
    assert sb.run("print(1)").stdout == "1\n"
held = pool.lease()  # one out, mid-episode, when the signal comes
lease = held.__enter__()
assert lease.run("x = 2").status == "ok"
print(pool.pool_id, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_pools_containers_go_when_a_plain_script_is_killed(sig: signal.Signals) -> None:
    require_docker()
    client = docker_client(timeout=30)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    labels = [f"{_reap.OWNER}={child.pid}"]
    try:
        pool_id = child.stdout.readline().strip()
        assert pool_id, "the child's pool did not start"
        labels.append(f"{_reap.POOL}={pool_id}")
        mine = {c.id for c in client.containers.list(all=True, filters={"label": labels})}
        assert len(mine) == 2
        since = time.time()
        child.send_signal(sig)
        assert child.wait(timeout=30) == -sig  # the default action: no handler, no atexit
        destroyed: set[str] = set()
        events = client.events(since=since - 1, until=since + BOUND_S, decode=True,
                               filters={"type": "container", "event": "destroy",
                                        "label": labels})
        for event in events:  # ends at `until`
            destroyed.add(event["id"])
            if destroyed >= mine:
                break
        assert destroyed >= mine, f"left running after {BOUND_S:g} s: {mine - destroyed}"
        assert client.containers.list(all=True, filters={"label": labels}) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for left in client.containers.list(all=True, filters={"label": labels}):
            left.remove(force=True)  # the child's, which this test started

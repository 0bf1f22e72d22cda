"""A container create that the client gave up on, but that the daemon carried out, leaves nothing.

Under load (a 2-core CI machine running the whole suite) docker-py's request can time out
after the daemon has accepted it: ``containers.create`` raises, yet the container appears,
labelled as this process's. Nobody knew its id: it never started, so the daemon's
auto-remove (its lifeline ends with the process) never applied, and the reaper spares a live
owner's containers until their expiry (a day). It outlived its pool, and the process.

The timeout is made deterministic, not waited for: the real create runs against the real
daemon, then the client raises the error requests raises when its read times out.
"""

from __future__ import annotations

import uuid

import pytest
import requests

from agentgym import SandboxError
from agentgym.sandboxes import DockerHost, DockerSandbox, SandboxPool, _reap

pytestmark = pytest.mark.docker

TEST_LABEL = "agentgym.test"


def client_whose_creates_time_out(times: int):
    """A client of the local daemon whose first ``times`` creates time out once made."""
    client = DockerHost().connect()
    real_create = client.api.create_container
    left = [times]

    def create(*args, **kwargs):
        made = real_create(*args, **kwargs)  # the daemon makes it ...
        if left[0] > 0:
            left[0] -= 1  # ... but the client had stopped waiting
            raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=60)")
        return made

    client.api.create_container = create
    return client


def containers_labelled(client, key: str, value: str) -> list[str]:
    """Short ids of the containers, running or not, labelled ``key=value``."""
    return [c.short_id for c in client.containers.list(
        all=True, filters={"label": f"{key}={value}"}, ignore_removed=True)]


def test_a_sandbox_whose_create_timed_out_leaves_no_container(docker_ready):
    client = client_whose_creates_time_out(1)
    tag = uuid.uuid4().hex
    sandbox = DockerSandbox(client=client, labels={TEST_LABEL: tag})
    with pytest.raises(SandboxError, match="cannot create a container"):
        sandbox.start()
    try:
        assert containers_labelled(client, TEST_LABEL, tag) == []
        assert sandbox.start().run("print(6 * 7)").stdout == "42\n"  # the next start works
    finally:
        sandbox.close()
        client.close()


def test_a_pool_whose_start_gave_up_on_a_create_leaves_no_container(docker_ready):
    client = client_whose_creates_time_out(1)
    pool = SandboxPool(size=2, client=client)
    try:
        with pytest.raises(SandboxError, match="Read timed out"):
            pool.start()  # one host, one creation failed: the start fails and closes the pool
        assert pool.closed
        assert containers_labelled(client, _reap.POOL, pool.pool_id) == []
    finally:
        client.close()

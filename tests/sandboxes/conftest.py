"""Fixtures for the sandbox tests: a real Docker daemon, one shared warm pool, no leftovers.

`require_docker()` skips a test when the daemon (or the image) is missing, and fails it
instead when ``AGENTGYM_STRICT_DEPS=1`` (CI), so CI cannot go green by skipping. The
multi-host tests add a second daemon over mutual TLS (`tls_daemon`, see ``tls_daemon.py``).
"""

from __future__ import annotations

import datetime
import functools
import os

import pytest

from agentgym.sandboxes import DEFAULT_IMAGE, DockerHost, SandboxPool, _reap
from tests.conftest import skip_or_fail
from tests.sandboxes.tls_daemon import TlsDaemon, Unavailable
from tests.timeline import running_test_at


@functools.cache
def _docker_problem() -> str | None:
    try:
        from agentgym.sandboxes._client import docker_client

        client = docker_client(timeout=10)
    except Exception as exc:
        return f"Docker daemon unreachable: {exc}"
    try:
        client.images.get(DEFAULT_IMAGE)
    except Exception:
        return f"image {DEFAULT_IMAGE} missing: run `agentgym sandbox build`"
    return None


def require_docker() -> None:
    """Skip (or, with AGENTGYM_STRICT_DEPS=1, fail) unless Docker and the image are ready."""
    problem = _docker_problem()
    if problem is not None:
        skip_or_fail(problem)


def _client():
    from agentgym.sandboxes._client import docker_client as make

    return make()


MAKE_FIFO = "import os\nos.mkfifo('ready')"
"""Code that prepares `BLOCKING_CELL`'s handshake (run it first, in the same work dir)."""
BLOCKING_CELL = ("import os, time\nwith open('ready', 'w') as fh:\n    fh.write(str(os.getpid()))\n"
                 "time.sleep(60)")
"""Code that says it started (see `wait_until_code_runs`), then runs for a minute."""


#: Read the handshake FIFO ``ready`` once it exists (a verified candidate makes its own: verify
#: empties the work dir first), at most 30 s.
READ_HANDSHAKE = ["timeout", "30", "sh", "-c", "until [ -p ready ]; do sleep 0.01; done; cat ready"]


def wait_until_code_runs(sb) -> int:
    """Block until `BLOCKING_CELL` runs in ``sb``; return the pid of its process.

    The cell opens the FIFO ``ready`` for writing, which returns only once this reader has
    opened it, so the handshake needs no sleep (only a wait for the FIFO to exist, where the
    code makes it).
    """
    uid = sb.config.code_uid
    return read_handshake(sb._container, f"{uid}:{uid}", sb.config.workdir)


def read_handshake(container, user: str, workdir: str) -> int:
    """`READ_HANDSHAKE` in ``container`` as ``user``: the pid the code wrote into ``ready``."""
    for _ in range(3):  # a verify's clean-up kills the code uid's processes, this reader too
        r = container.exec_run(READ_HANDSHAKE, user=user, workdir=workdir)
        if r.exit_code != 137:  # SIGKILL: it started before the clean-up; read again after it
            break
    assert r.exit_code == 0, r.output
    return int(r.output)


def alive(sb, pid: int) -> bool:
    """Whether process ``pid`` of ``sb``'s container exists and is not a zombie."""
    check = f"test -e /proc/{pid} && ! grep -q '^State:.*Z' /proc/{pid}/status"
    return sb._container.exec_run(["sh", "-c", check]).exit_code == 0


def made_by(containers: list) -> dict[str, str]:
    """Each container's short id and the test this process ran when the container was made."""
    return {c.short_id: _maker(c) for c in containers}


def _maker(container) -> str:
    """The test running when ``container`` was made (it may be removed while we look)."""
    from docker.errors import NotFound

    try:
        return running_test_at(_created(container))
    except NotFound:
        return "unknown: removed during the check"


def _created(container) -> float:
    """The container's creation time as a Unix time, to the nanosecond Docker's inspect gives.

    (A listed container's ``Created`` is whole seconds: too coarse to tell two tests apart.)
    """
    container.reload()
    stamp = container.attrs["Created"]  # e.g. 2026-12-07T05:31:02.123456789Z
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    utc = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
    return utc.timestamp() + float(f"0.{fraction or 0}")


def own_containers(client=None) -> list:
    """Agentgym containers owned by this test process (on ``client``'s daemon; default local)."""
    return [c for c in _reap.managed_containers(client or _client())
            if c.labels.get(_reap.OWNER) == str(os.getpid())]


@pytest.fixture(scope="session")
def docker_client():
    """A docker-py client (skips, or fails under AGENTGYM_STRICT_DEPS=1, without Docker)."""
    require_docker()
    return _client()


@pytest.fixture
def docker_ready():
    """Use when a test makes its own sandboxes: the daemon and image must be there."""
    require_docker()


@pytest.fixture(scope="session")
def pool():
    """A shared warm pool for the whole session (tests lease from it)."""
    require_docker()
    p = SandboxPool(size=3, max_concurrent_creates=2).start()
    yield p
    p.close()


@pytest.fixture
def sb(pool):
    """A sandbox leased from the shared pool for one test (reset when the test ends)."""
    with pool.lease(timeout=60) as sandbox:
        yield sandbox


@pytest.fixture(scope="session", autouse=True)
def no_leftover_containers():
    """After the suite, no agentgym container of this process may remain."""
    yield
    if _docker_problem() is not None:
        return
    left = own_containers()
    assert not left, f"leaked containers: {made_by(left)}"


@pytest.fixture(scope="session")
def tls_daemon():
    """A second dockerd on loopback over mutual TLS, with the sandbox image loaded.

    Skips (fails under AGENTGYM_STRICT_DEPS=1) where it cannot run: not root, no dockerd. At
    the end no container of this process may be left on it; then it is stopped and deleted.
    """
    require_docker()
    try:
        daemon = TlsDaemon()
    except Unavailable as exc:
        skip_or_fail(str(exc))
    try:
        daemon.start()
        daemon.load_image(DEFAULT_IMAGE)
        yield daemon
        daemon.start()  # a test may have stopped it: the check below needs it
        left = own_containers(daemon.host().connect())
        assert not left, f"leaked containers on the TLS daemon: {made_by(left)}"
    finally:
        daemon.remove()


@pytest.fixture
def tls_host(tls_daemon) -> DockerHost:
    """The TLS daemon as a pool host, running (a test before may have stopped it)."""
    tls_daemon.start()
    return tls_daemon.host()

"""What one lease of a pooled sandbox can leave for the next lease of the same container.

The policy's view: a pool hands the same container to many episodes (later ones, and the
siblings of a GRPO group), resetting it between leases. Anything that survives the reset is a
channel from one episode to another: the answer found by one rollout, or code that makes a
later verification pass. ``test_sandbox_attacks*.py`` cover the files, processes and IPC
objects a soft reset removes; these tests cover the code server itself, which a reset restarts
when the code killed it.

Why the server can be killed between calls: the session kernel outlives every call and runs
as the server's uid, so a thread it started can kill the server once the call's reply is out;
the next reset then restarts the server (``docker exec python3 -s -c ...``). Those tests kill it
from outside at that moment, which is deterministic and exactly what such a thread does.
"""

from __future__ import annotations

import time

import pytest

from agentgym.sandboxes import SandboxPool
from tests.sandboxes.conftest import alive

pytestmark = pytest.mark.docker

PLANTED = "planted by an earlier lease"
SETS_A_MARK = f"import os\nos.environ['AGENTGYM_PLANTED'] = {PLANTED!r}\n"
# A stand-in for a standard-library module the server imports at start; it leaves a mark in
# the server's environment (inherited by every later call), then hands over the real module.
SHADOWS_BASE64 = SETS_A_MARK + (
    "import sys\n"
    "del sys.modules[__name__]\n"
    "saved = sys.path[:]\n"
    "sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]\n"
    "try:\n"
    "    import base64 as real\n"
    "finally:\n"
    "    sys.path[:] = saved\n"
    "sys.modules[__name__] = real\n"
)
# The same mark from a .pth file of the user site-packages ($HOME is the work dir).
PLANTS_A_PTH = (
    "import os, site\n"
    "os.makedirs(site.getusersitepackages(), exist_ok=True)\n"
    "with open(os.path.join(site.getusersitepackages(), 'planted.pth'), 'w') as fh:\n"
    f"    fh.write({SETS_A_MARK.replace(chr(10), '; ').rstrip('; ')!r} + '\\n')\n"
)
READS_THE_MARK = "import os\nprint(os.environ.get('AGENTGYM_PLANTED'))"
KILLS_THE_SERVER = (
    "import os\n"
    "pid = os.getpid()\n"
    "while True:  # up the parents to the code server, the process docker exec started\n"
    "    ppid = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])\n"
    "    if ppid == 0:\n"
    "        break\n"
    "    pid = ppid\n"
    "os.kill(pid, 9)\n"
)
"""Code that kills the code server running it (same uid), as a policy's tool call can."""


@pytest.fixture
def one_sandbox_pool(docker_ready):
    """A pool of one sandbox: every lease gets the same container (unless it is replaced)."""
    with SandboxPool(size=1) as pool:
        yield pool


def kill_the_server(sb) -> None:
    """Kill ``sb``'s code server as the code uid, and return once it is gone."""
    pid = sb._channel.server_pid
    uid = sb.config.code_uid
    killed = sb._container.exec_run(["sh", "-c", f"kill -9 {pid}"], user=f"{uid}:{uid}")
    assert killed.exit_code == 0, killed.output
    deadline = time.monotonic() + 10
    while alive(sb, pid):
        assert time.monotonic() < deadline, "the code server outlived kill -9"


@pytest.mark.parametrize("plant", ["cwd_module", "user_site_pth"])
def test_a_restarted_code_server_runs_nothing_the_last_lease_planted(one_sandbox_pool, plant):
    # The server used to start with the work dir as its cwd (first on its sys.path for
    # ``-c``) and $HOME (the user site-packages, whose .pth files run at start): a module or a
    # .pth left there ran inside the restarted server, before it wiped the work dir, and so
    # reached every later lease of the container (and could forge verify's reports).
    with one_sandbox_pool.lease() as sb:
        container = sb.container_id
        if plant == "cwd_module":
            assert sb.run("pass", files={"base64.py": SHADOWS_BASE64}, session=False).ok
        else:
            assert sb.run(PLANTS_A_PTH, session=False).ok
        kill_the_server(sb)
    with one_sandbox_pool.lease() as sb:
        assert sb.container_id == container, "the pool replaced the container: nothing tested"
        r = sb.run(READS_THE_MARK)
        assert (r.ok, r.stdout) == (True, "None\n"), r
        assert sb.run("import os\nprint(sorted(os.listdir('.')))").stdout == "[]\n"


def test_a_module_planted_then_a_killed_server_cannot_reach_the_same_lease(one_sandbox_pool):
    # The code kills the server from inside its own call; the host restarts the server for
    # the rest of the lease (verification included) without wiping the work dir.
    with one_sandbox_pool.lease() as sb:
        r = sb.run(KILLS_THE_SERVER, files={"base64.py": SHADOWS_BASE64})
        assert not r.ok and "server died" in r.stderr, r
        r = sb.run(READS_THE_MARK, session=False)
        assert (r.ok, r.stdout) == (True, "None\n"), r

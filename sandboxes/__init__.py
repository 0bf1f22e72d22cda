"""Sandboxes: where model-written code runs.

Backends behind one `Sandbox` protocol:

- `DockerSandbox`: a hardened container (no network, read-only root, tmpfs work dir, memory =
  memory+swap, CPU quota, pids limit, no capabilities, no-new-privileges, code uid distinct
  from the keeper's, nofile/fsize ulimits, output capped in the container, ownership labels)
  with a warm in-container code server, so a warm call costs a fork, not a ``docker exec``.
- `SandboxPool`: warm DockerSandboxes leased per episode (`SandboxLease`: calls still running
  when it ends are killed first), reset between leases, recycled after N uses or a failure,
  bounded concurrent creation, leaked containers reaped.
- `DockerHost`: where a pool's sandboxes run; one pool can span the local daemon, daemons
  over mutual TLS and over ssh, with a warm share on each, capped creation, reaping on every
  host, and routing around a host that fails.
- `LocalSandbox`: a subprocess with rlimits for machines without Docker; NOT a security
  boundary, and it says so.

Plus `SandboxToolEnv` (the env rung: a sandbox leased per episode from a pool shared per
process), `verify` (tests of one sample in one call, infra errors apart from code failures),
`Snapshot` (fork a sandbox's files to many rollouts or to a verifier) and `build_image`.
Importing this package does not import ``docker``; the first Docker call does.
"""

from ._config import DEFAULT_IMAGE, DockerSandboxConfig
from ._docker import DockerSandbox, Snapshot
from ._env import SandboxToolEnv, close_shared_pools, closing_new_shared_pools
from ._hosts import DockerHost
from ._image import build_image
from ._lease import SandboxLease
from ._local import LocalSandbox, LocalSandboxConfig
from ._pool import HostStats, PoolStats, SandboxPool
from ._protocol import Sandbox
from ._reap import reap_leaked
from ._result import ExecResult, ExecStatus
from ._verify import TestResult, VerifyResult, averify, verify

__all__ = [
    "DEFAULT_IMAGE",
    "DockerHost",
    "DockerSandbox",
    "DockerSandboxConfig",
    "ExecResult",
    "ExecStatus",
    "HostStats",
    "LocalSandbox",
    "LocalSandboxConfig",
    "PoolStats",
    "Sandbox",
    "SandboxLease",
    "SandboxPool",
    "SandboxToolEnv",
    "Snapshot",
    "TestResult",
    "VerifyResult",
    "averify",
    "build_image",
    "close_shared_pools",
    "closing_new_shared_pools",
    "reap_leaked",
    "verify",
]

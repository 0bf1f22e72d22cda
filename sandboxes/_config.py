"""`DockerSandboxConfig`: every hardening knob of a Docker sandbox, hardened by default.

Each field's default is the hardened choice. Loosening one (network for a search tool, more
memory, a writable root) is an explicit change of that field, and `DockerSandboxConfig.loosened`
names every such change so the sandbox logs it when the container starts: never silently.
"""

from __future__ import annotations

import dataclasses
import math
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentgym._errors import ConfigError

DEFAULT_IMAGE = "agentgym-sandbox:py3"
"""Tag of the default image that ``agentgym sandbox build`` produces (python3 + pytest)."""


MIN_MEM_MB = 64  # the code server + verify's runner + pytest, with room to spare
MAX_TIMEOUT_S = 7 * 86400.0  # what a call's timeout may be (_protocol.check_timeout)
MIN_PIDS = 16  # keeper, server, kernel, a call's child and grandchild, runner, judge, factory
MIN_NOFILE = 32  # measured: no container started at 10 files, verify's pytest failed at 16
MIN_CPUS = 0.01  # Docker's smallest CPU quota
MAX_PIDS = 4 * 1024 * 1024  # the kernel's PID_MAX_LIMIT: the cgroup's pids.max refuses more
MAX_ID = 2**31 - 1  # Docker: "uids and gids must be in range 0-2147483647"
MAX_MIB = (2**63 - 1) >> 20  # Docker takes these sizes as int64 bytes

@dataclass(frozen=True)
class DockerSandboxConfig:
    """Hardening and resource knobs of one `DockerSandbox` container.

    Example::

        cfg = DockerSandboxConfig()                                 # hardened defaults
        web = DockerSandboxConfig(network_mode="bridge")            # explicit loosening
        assert web.loosened() == ["network_mode='bridge' (default 'none')"]
    """

    network_mode: str = "none"
    """Docker network mode. ``"none"``: loopback only. ``"bridge"`` (or a network name) gives
    the code network access; only for tools that need it (e.g. a search tool)."""
    mem_limit_mb: int = 512
    """Memory limit of the whole container in MiB; swap is set equal (no swap at all). The
    tmpfs mounts are charged to this limit too."""
    cpus: float = 1.0
    """CPU quota in cores (``nano_cpus``); 1.0 = one core's worth of time."""
    pids_limit: int = 64
    """Maximum number of processes and threads in the container (stops fork bombs)."""
    read_only_root: bool = True
    """Mount the image's root filesystem read-only; only the tmpfs mounts are writable."""
    workdir: str = "/work"
    """Absolute path of the tmpfs work directory: the code's cwd and ``HOME``."""
    workdir_size_mb: int = 64
    """Size of the work-directory tmpfs in MiB."""
    workdir_exec: bool = True
    """Allow executing files in the work directory (``exec`` tmpfs flag; Docker's default is
    ``noexec``). ``/tmp`` is always ``noexec``."""
    tmp_size_mb: int = 64
    """Size of the ``/tmp`` tmpfs in MiB."""
    shm_size_mb: int = 16
    """Size of ``/dev/shm`` in MiB (private IPC namespace)."""
    code_uid: int = 1000
    """Non-root uid (and gid) the code runs as. Must differ from `keeper_uid` so the code
    cannot signal the keeper, and so that ``kill -9 -1`` as this uid ends every code process."""
    keeper_uid: int = 1001
    """Non-root uid of the container's keeper process (``docker-init`` + ``cat``)."""
    nofile: int = 256
    """``RLIMIT_NOFILE``: open files per process."""
    fsize_mb: int = 64
    """``RLIMIT_FSIZE`` in MiB: the largest file any process may write."""
    output_limit_bytes: int = 1 << 20
    """Cap on stdout + stderr of one call, enforced inside the container; past it the code is
    killed and the result has status ``output_limit`` and ``truncated=True``."""
    default_timeout: float = 10.0
    """Seconds a call may run when the caller passes no ``timeout``."""
    host_grace_s: float = 5.0
    """Extra seconds the host waits past a call's timeout before it kills every code process
    from outside (``docker exec``) and, if that fails too, replaces the container."""
    drop_all_capabilities: bool = True
    """``cap_drop=["ALL"]``. Set False only with a reason; `cap_add` adds single ones back."""
    cap_add: tuple[str, ...] = ()
    """Capabilities added back after dropping all (e.g. ``("NET_RAW",)``); empty by default."""
    no_new_privileges: bool = True
    """``security_opt=["no-new-privileges"]``: setuid binaries cannot raise privileges."""
    python_session: bool = True
    """``run(language="python")`` keeps one Python session per sandbox (per pool lease):
    globals persist across calls like notebook cells. A cell that is killed (timeout, memory,
    output limit) rolls the session back to its state before that cell. False: every call is
    a fresh interpreter."""
    runtime: str | None = None
    """OCI runtime (e.g. ``"runsc"`` for gVisor); None = the daemon's default (runc)."""
    environment: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the code (the base set is PATH, HOME, LANG)."""
    max_lifetime_s: float | None = 24 * 3600.0
    """Seconds after creation when any agentgym reaper may remove the container even though
    its owner lives (label ``agentgym.expires``): the owner's machine alone can tell whether
    the owner lives, so this frees the containers of a wedged process on another machine that
    shares the daemon. Pools replace a sandbox when a tenth of this is left. None: no expiry."""

    def __post_init__(self) -> None:
        """Check values and cross-field rules before any container starts."""
        positive = ("mem_limit_mb", "pids_limit", "workdir_size_mb", "tmp_size_mb",
                    "shm_size_mb", "nofile", "fsize_mb", "output_limit_bytes")
        self._check_types(positive)
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        # Below these the harness itself cannot run (the code server, verify's runner, judge
        # and factory, pytest): every sample then fails as the code's doing, reward 0, not
        # infra_error (measured: pytest mode failed at 32 MiB, verify at 6 pids).
        for name, least in (("mem_limit_mb", MIN_MEM_MB), ("pids_limit", MIN_PIDS),
                            ("nofile", MIN_NOFILE)):
            if getattr(self, name) < least:
                raise ConfigError(f"{name} must be >= {least}, got {getattr(self, name)!r}: "
                                  "below that the sandbox's own server and verify's runner "
                                  "do not fit (the default is "
                                  f"{getattr(DockerSandboxConfig, name)})")
        if self.max_lifetime_s is not None and self.max_lifetime_s <= 0:
            raise ConfigError(f"max_lifetime_s must be > 0 or None, got {self.max_lifetime_s!r}")
        if self.cpus <= 0 or self.default_timeout <= 0 or self.host_grace_s <= 0:
            raise ConfigError("cpus, default_timeout and host_grace_s must be > 0, got "
                              f"{self.cpus!r}, {self.default_timeout!r}, {self.host_grace_s!r}")
        if self.code_uid <= 0 or self.keeper_uid <= 0:
            raise ConfigError(f"code_uid and keeper_uid must be non-root (> 0), got "
                              f"{self.code_uid} and {self.keeper_uid}")
        self._check_docker_ranges()
        if self.code_uid == self.keeper_uid:
            raise ConfigError(f"code_uid and keeper_uid must differ (both {self.code_uid}): "
                              "otherwise the code can kill the keeper")
        if not posixpath.isabs(self.workdir) or posixpath.normpath(self.workdir) in ("/", "/tmp"):
            raise ConfigError(f"workdir must be an absolute path other than / and /tmp, "
                              f"got {self.workdir!r}")
        self._check_import_paths()

    def _check_types(self, whole: tuple[str, ...]) -> None:
        """Whole numbers where Docker takes them; finite numbers for the rest.

        Why: a YAML ``"256"`` raised a bare ``TypeError`` here, and nan or inf passed every
        ``<= 0`` test: ``default_timeout=nan`` made every later call a ``ConfigError``
        about a ``timeout`` the caller never passed, ``cpus=nan`` every start an
        ``infra_error``.
        """
        for name in whole + ("code_uid", "keeper_uid"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be a whole number, got {value!r}")
        for name in ("cpus", "default_timeout", "host_grace_s", "max_lifetime_s"):
            value = getattr(self, name)
            if value is None and name == "max_lifetime_s":
                continue
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)):
                raise ConfigError(f"{name} must be a finite number of "
                                  f"{'CPUs' if name == 'cpus' else 'seconds'}, got {value!r}")
        if self.default_timeout > MAX_TIMEOUT_S:
            raise ConfigError(f"default_timeout must be <= {MAX_TIMEOUT_S:g} s (a week), got "
                              f"{self.default_timeout!r}")

    def _check_docker_ranges(self) -> None:
        """Refuse values that Docker, runc or the kernel refuse at every container start.

        Why up front: ``cpus=0.005``, ``code_uid=2**32 + 5`` or ``pids_limit=2**62`` passed
        here, the trainer's preflight passed, and then every container start failed with a
        raw runc error of 500 characters: every episode an ``infra_error``.
        """
        if self.cpus < MIN_CPUS:
            raise ConfigError(f"cpus must be >= {MIN_CPUS} (Docker's smallest CPU quota), got "
                              f"{self.cpus!r}")
        for name, most, why in (
                ("pids_limit", MAX_PIDS, "the kernel's largest pid limit"),
                ("code_uid", MAX_ID, "Docker's largest uid"),
                ("keeper_uid", MAX_ID, "Docker's largest uid"),
                *((name, MAX_MIB, "Docker takes it as 64-bit bytes")
                  for name in ("mem_limit_mb", "fsize_mb", "shm_size_mb"))):
            if getattr(self, name) > most:
                raise ConfigError(f"{name} must be <= {most} ({why}), got "
                                  f"{getattr(self, name)!r}")

    def _check_import_paths(self) -> None:
        """Refuse a PYTHONPATH (or PYTHONHOME) into a folder the code can write.

        Why: the environment reaches the sandbox's own code server, which starts again after
        a reset or after the code killed it; a module the code left in such a folder (a
        ``base64.py``) would run inside the server, which builds verify's reports.
        """
        writable = (self.workdir, "/tmp", "/dev/shm", "/dev/mqueue")
        for name in ("PYTHONPATH", "PYTHONHOME"):
            for entry in self.environment.get(name, "").split(":"):
                folder = posixpath.normpath(entry) if posixpath.isabs(entry) else None
                if folder and any(folder == w or folder.startswith(w + "/") for w in writable):
                    raise ConfigError(
                        f"environment {name} entry {entry!r} is a folder the code can write, "
                        "so code could plant modules in the sandbox's server; use a folder "
                        "of the image, or extend sys.path in the code itself"
                    )

    def loosened(self) -> list[str]:
        """Every security-relevant field that differs from the hardened default, as text."""
        default = DockerSandboxConfig()
        keys = ("network_mode", "read_only_root", "drop_all_capabilities", "cap_add",
                "no_new_privileges", "runtime", "pids_limit", "mem_limit_mb", "cpus")
        out = []
        for name in keys:
            mine, base = getattr(self, name), getattr(default, name)
            if mine != base and (name not in ("pids_limit", "mem_limit_mb", "cpus")
                                 or mine > base):
                out.append(f"{name}={mine!r} (default {base!r})")
        return out

    def replace(self, **changes: Any) -> DockerSandboxConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


# Docker's image reference grammar (distribution/reference): [host[:port]/]path[:tag][@digest]
_HOST_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


def check_image(image: object) -> str:
    """``image`` if it is a Docker image reference, else a `ConfigError`.

    Why up front: ``image=3``, ``""`` or ``"UPPER/Case:x"`` was taken as it was and failed
    only when the first container was created, for a bare sandbox as an ``infra_error`` of
    its first call.
    """
    if not isinstance(image, str) or not IMAGE_REFERENCE.fullmatch(image):
        raise ConfigError(f"image must be a Docker image reference such as {DEFAULT_IMAGE!r} "
                          "([host[:port]/]lowercase/path[:tag][@digest]), got "
                          f"{image!r:.200}")
    return image


def missing_image_fix(image: str) -> str:
    """How to get ``image`` onto a daemon that lacks it (`agentgym sandbox build` makes one tag)."""
    if image == DEFAULT_IMAGE:
        return "build it with `agentgym sandbox build`"
    return (f"pull it (`docker pull {image}`) or build it there (`agentgym sandbox build "
            f"--tag {image}`)")


def docker_config(config: object, what: str = "config") -> DockerSandboxConfig:
    """``config`` as a `DockerSandboxConfig`: itself, the default for None, or built from a mapping.

    Why a mapping: a training config is YAML (``env_kwargs: {sandbox_config: {mem_limit_mb:
    256}}``), which cannot name a class; its keys are the dataclass's fields, checked now. A
    mapping used to be taken as it was and failed only at the first container ("'dict'
    object has no attribute 'loosened'").
    """
    if config is None:
        return DockerSandboxConfig()
    if isinstance(config, DockerSandboxConfig):
        return config
    if isinstance(config, Mapping):
        fields = {f.name for f in dataclasses.fields(DockerSandboxConfig)}
        unknown = sorted(str(k) for k in config if k not in fields)
        if unknown:
            raise ConfigError(f"{what}: unknown knob(s) {', '.join(unknown)}; "
                              f"DockerSandboxConfig has {', '.join(sorted(fields))}")
        return DockerSandboxConfig(**config)
    raise ConfigError(f"{what} must be a DockerSandboxConfig, a mapping of its knobs, or None; "
                      f"got {type(config).__name__}")

"""Build the default sandbox image: from ``Dockerfile`` with a registry, or offline (debootstrap).

Offline recipe (no registry, root needed)::

    debootstrap --variant=minbase --include=python3,python3-pytest bookworm ROOTFS MIRROR
    tar -C ROOTFS -c . | docker import --change ... - agentgym-sandbox:py3

``MIRROR`` comes from this machine's own apt sources (``/etc/apt/sources.list.d/*.sources``
``URIs:`` lines, or ``deb`` lines in ``/etc/apt/sources.list``); it is never hard-coded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from agentgym._errors import ConfigError, SandboxError

from ._client import docker_client
from ._config import DEFAULT_IMAGE

BuildMethod = Literal["auto", "debootstrap", "dockerfile"]
DOCKERFILE = Path(__file__).with_name("Dockerfile")
SUITE = "bookworm"
PACKAGES = ("python3", "python3-pytest")
REGISTRY_PROBE = "https://registry-1.docker.io/v2/"
IMPORT_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    "WORKDIR /work",
    'CMD ["sleep", "infinity"]',
]


def registry_reachable(timeout: float = 3.0) -> bool:
    """True when Docker Hub's registry answers HTTP at all (a 401 counts as reachable)."""
    try:
        urllib.request.urlopen(REGISTRY_PROBE, timeout=timeout)
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    return True


def apt_mirror(sources_dir: str = "/etc/apt") -> str:
    """The Debian mirror this machine's apt uses (first non-security ``URIs:``/``deb`` entry)."""
    root = Path(sources_dir)
    texts = [p.read_text() for p in sorted((root / "sources.list.d").glob("*.sources"))]
    uris = [u for t in texts for u in re.findall(r"^URIs:\s*(\S+)", t, re.M)]
    legacy = root / "sources.list"
    if legacy.exists():
        uris += re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", legacy.read_text(), re.M)
    uris = [u for u in uris if "security" not in u] or uris
    if not uris:
        raise ConfigError(
            f"no apt mirror found under {sources_dir} (looked for 'URIs:' and 'deb' lines); "
            "pass mirror=... / --mirror explicitly"
        )
    return uris[0]


def build_image(
    tag: str = DEFAULT_IMAGE,
    method: BuildMethod = "auto",
    mirror: str | None = None,
    log: Callable[[str], None] = print,
) -> str:
    """Build the sandbox image and return its id.

    ``method="auto"`` uses ``sandboxes/Dockerfile`` when a registry is reachable, else the
    offline debootstrap path (needs root, ``debootstrap`` and ``tar``). ``mirror`` overrides
    the apt mirror read from this machine's sources.
    """
    if method not in ("auto", "debootstrap", "dockerfile"):
        raise ConfigError(f"method must be auto, debootstrap or dockerfile, got {method!r}")
    if method == "auto":
        method = "dockerfile" if registry_reachable() else "debootstrap"
        log(f"registry {'reachable' if method == 'dockerfile' else 'unreachable'}: "
            f"building with {method}")
    client = docker_client(timeout=600)
    try:
        previous = _image_id(client, tag)
        if method == "dockerfile":
            image_id = _build_dockerfile(client, tag, log)
        else:
            image_id = _build_debootstrap(client, tag, mirror or apt_mirror(), log)
        if previous and previous != image_id:
            _remove_quietly(client, previous, log)
    finally:
        client.close()
    return image_id


def _image_id(client: Any, tag: str) -> str | None:
    try:
        return client.images.get(tag).id
    except Exception:  # not built yet
        return None


def _remove_quietly(client: Any, image_id: str, log: Callable[[str], None]) -> None:
    """Drop the image the new build replaced, unless a container still uses it."""
    try:
        client.images.remove(image_id)
        log(f"removed the previous image {image_id[:19]}")
    except Exception as exc:
        log(f"kept the previous image {image_id[:19]} ({type(exc).__name__})")


def _build_dockerfile(client: Any, tag: str, log: Callable[[str], None]) -> str:
    with DOCKERFILE.open("rb") as fh:
        try:
            image, events = client.images.build(fileobj=fh, tag=tag, rm=True, pull=True)
        except Exception as exc:
            raise SandboxError(f"docker build of {DOCKERFILE} failed: {exc}") from exc
    for event in events:
        if "stream" in event and event["stream"].strip():
            log(event["stream"].rstrip())
    return image.id


def _build_debootstrap(client: Any, tag: str, mirror: str, log: Callable[[str], None]) -> str:
    for tool in ("debootstrap", "tar"):
        if shutil.which(tool) is None:
            raise SandboxError(f"`{tool}` not found: apt-get install -y {tool}")
    if os.geteuid() != 0:
        raise SandboxError("debootstrap needs root; rerun as root or use --method dockerfile")
    with tempfile.TemporaryDirectory(prefix="agentgym-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
               SUITE, str(rootfs), mirror]
        log(f"$ {' '.join(cmd)}")
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise SandboxError("debootstrap failed:\n" + "\n".join(tail))
        _strip_rootfs(rootfs)
        log(f"importing {rootfs} as {tag}")
        return _import_rootfs(client, rootfs, tag)


def _strip_rootfs(rootfs: Path) -> None:
    """Drop apt caches and docs the sandbox never needs (about a fifth of the size)."""
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
        target = rootfs / sub
        if target.is_dir():
            shutil.rmtree(target)
            target.mkdir()
    (rootfs / "work").mkdir(exist_ok=True)


def _import_rootfs(client: Any, rootfs: Path, tag: str) -> str:
    repository, _, version = tag.rpartition(":") if ":" in tag else (tag, "", "latest")
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."],
                           stdout=subprocess.PIPE)
    stream = tar.stdout
    assert stream is not None  # opened with stdout=PIPE
    try:
        out = client.api.import_image_from_stream(
            stream, repository=repository, tag=version, changes=IMPORT_CHANGES)
    finally:
        stream.close()
        tar.wait()
    if tar.returncode != 0:
        raise SandboxError(f"tar of {rootfs} failed with exit code {tar.returncode}")
    try:
        return client.images.get(tag).id
    except Exception as exc:
        raise SandboxError(f"docker import did not produce {tag}: {out!r}") from exc

"""`DockerHost`: where sandboxes run (the local daemon, a TLS daemon, a daemon over ssh).

A pool spreads its sandboxes over several hosts (``SandboxPool(hosts=[...])``); a single
`DockerSandbox` can use one too (``DockerSandbox(host=...)``). A host is only an address and
the files to authenticate with; connecting happens on first use.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agentgym._errors import ConfigError

from ._client import docker_client, import_docker

SCHEMES = ("unix", "tcp", "ssh")
DOCS = "docs/sandboxes.md#several-docker-hosts"


@dataclass(frozen=True)
class DockerHost:
    """One Docker daemon; checked when made, so a bad address fails before any container.

    Example::

        DockerHost()                                          # DOCKER_HOST, or the local socket
        DockerHost("unix:///var/run/docker.sock")
        DockerHost("tcp://10.0.0.5:2376", ca_cert="ca.pem", client_cert="cert.pem",
                   client_key="key.pem", name="gpu-1")        # mutual TLS
        DockerHost.from_cert_dir("tcp://10.0.0.5:2376", "~/.docker/gpu-1")
        DockerHost("ssh://agent@10.0.0.6")                    # needs pip install 'docker[ssh]'

    Plain ``tcp://`` is refused unless the address is loopback: a Docker API socket is root on
    that machine, so it must be mutual TLS (all three files) or ssh.
    """

    url: str | None = None
    """``unix://``, ``tcp://`` or ``ssh://`` address; None: the environment's daemon, found as
    the ``docker`` CLI finds it (``DOCKER_HOST``, ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``)."""
    ca_cert: str | None = None
    """CA that signed the daemon's certificate (``tcp://`` only, with the two below)."""
    client_cert: str | None = None
    """This client's certificate, signed by a CA the daemon trusts (``--tlscacert``)."""
    client_key: str | None = None
    """This client's private key."""
    name: str = ""
    """Label in stats, logs and errors; default: the address's host (``local`` for None)."""
    timeout: float = 60.0
    """Seconds any single call to this daemon may take before it counts as failed."""

    def __post_init__(self) -> None:
        """Refuse addresses that cannot work or are unsafe, each with a one-line fix."""
        if self.url is not None:
            self._check_url(self.url)
        if self.timeout <= 0:
            raise ConfigError(f"DockerHost timeout must be > 0, got {self.timeout!r}")
        if not self.name:
            object.__setattr__(self, "name", self._default_name())

    def _check_url(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise ConfigError(f"Docker host {url!r}: the address must start with unix://, "
                              "tcp:// or ssh://")
        files = [f for f in (self.ca_cert, self.client_cert, self.client_key) if f]
        if parts.scheme != "tcp" and files:
            raise ConfigError(f"Docker host {url!r}: TLS files apply to tcp:// only; drop "
                              "ca_cert/client_cert/client_key")
        if parts.scheme == "tcp":
            self._check_tls(url, parts.hostname or "", len(files))
        if parts.scheme == "ssh" and importlib.util.find_spec("paramiko") is None:
            raise ConfigError(f"Docker host {url!r}: ssh:// needs paramiko: "
                              "pip install 'docker[ssh]'")

    def _check_tls(self, url: str, hostname: str, given: int) -> None:
        if given == 0 and not _is_loopback(hostname):
            raise ConfigError(f"Docker host {url!r}: plain tcp to another machine is root "
                              "access for anyone on the network; pass ca_cert, client_cert "
                              f"and client_key (mutual TLS) or use ssh:// (see {DOCS})")
        if given not in (0, 3):
            raise ConfigError(f"Docker host {url!r}: TLS needs all three of ca_cert, "
                              "client_cert and client_key")
        for path in (self.ca_cert, self.client_cert, self.client_key):
            if path and not os.path.isfile(path):
                raise ConfigError(f"Docker host {url!r}: TLS file {path} does not exist "
                                  f"(make it as in {DOCS})")

    def _default_name(self) -> str:
        if self.url is None:
            return "local"
        parts = urlsplit(self.url)
        return parts.netloc or parts.path  # "user@host:22", "10.0.0.5:2376", "/run/docker.sock"

    @classmethod
    def from_cert_dir(cls, url: str, cert_dir: str | Path, *, name: str = "",
                      timeout: float = 60.0) -> DockerHost:
        """A mutual-TLS host whose files use Docker's names: ``ca.pem``, ``cert.pem``, ``key.pem``.

        That is the layout of ``DOCKER_CERT_PATH`` and ``~/.docker``.
        """
        d = Path(cert_dir).expanduser()
        return cls(url, ca_cert=str(d / "ca.pem"), client_cert=str(d / "cert.pem"),
                   client_key=str(d / "key.pem"), name=name, timeout=timeout)

    @classmethod
    def parse(cls, spec: str | Mapping[str, Any] | DockerHost | None) -> DockerHost:
        """``spec`` as a host: a `DockerHost`, an address, None (the default), or a mapping.

        A mapping comes from a config file: ``{url, cert_dir}`` or `DockerHost`'s fields.
        """
        if isinstance(spec, DockerHost):
            return spec
        if isinstance(spec, Mapping):
            fields = dict(spec)
            try:
                if "cert_dir" in fields:
                    return cls.from_cert_dir(fields.pop("url"), fields.pop("cert_dir"), **fields)
                return cls(**fields)
            except (KeyError, TypeError) as exc:
                raise ConfigError(
                    f"Docker host {dict(spec)!r} is not understood ({exc}); give "
                    "{url, cert_dir} or DockerHost's fields (url, ca_cert, client_cert, ...)"
                ) from exc
        return cls(spec)

    def connect(self, timeout: float | None = None) -> Any:
        """A connected ``docker.DockerClient`` (``REQUESTS_CA_BUNDLE`` and proxies ignored).

        ``timeout`` overrides the host's for this client (health checks use a short one).
        Raises `SandboxError` when the daemon does not answer.
        """
        return docker_client(self.timeout if timeout is None else timeout, base_url=self.url,
                             tls=self._tls_config(), where=f" {self.name!r}")

    def _tls_config(self) -> Any:
        if self.ca_cert is None or self.client_cert is None or self.client_key is None:
            return None
        docker = import_docker()
        return docker.tls.TLSConfig(client_cert=(self.client_cert, self.client_key),
                                    ca_cert=self.ca_cert, verify=True)


def _is_loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False

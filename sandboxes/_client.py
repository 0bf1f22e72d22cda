"""The one place that imports the ``docker`` SDK, lazily, with errors that name the fix."""

from __future__ import annotations

import functools
import os
from typing import Any

from agentgym._errors import SandboxError

INSTALL_HINT = "pip install 'agentgym[sandbox]'"


def import_docker() -> Any:
    """Return the ``docker`` module, or raise `SandboxError` naming the extra to install."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SandboxError(
            f"the Docker sandbox needs the `docker` package: {INSTALL_HINT}"
        ) from exc
    return docker


@functools.cache
def _client_class() -> Any:
    """``docker.DockerClient`` whose HTTP session ignores requests' environment settings.

    Why: docker-py's API client is a ``requests.Session``, and requests lets
    ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` override the session's CA per request, so a
    machine-wide bundle replaced the daemon's CA and every TLS call failed with
    CERTIFICATE_VERIFY_FAILED. ``trust_env`` must be off before the constructor's first
    request (the API version probe), hence a class, not an attribute set afterwards; it
    also keeps ``HTTPS_PROXY`` and ``.netrc`` away from the daemon connection.
    """
    docker = import_docker()
    api_base: Any = docker.APIClient
    client_base: Any = docker.DockerClient

    class APIClient(api_base):
        @property
        def trust_env(self) -> bool:
            return False

        @trust_env.setter
        def trust_env(self, value: bool) -> None:  # requests.Session.__init__ sets it
            pass

    class DockerClient(client_base):
        def __init__(self, **kwargs: Any) -> None:  # the parent only builds ``api``
            self.api = APIClient(**kwargs)

    return DockerClient


def docker_client(timeout: float = 60.0, *, base_url: str | None = None,
                  tls: Any = None, where: str = "") -> Any:
    """A connected ``docker.DockerClient``; raises `SandboxError` when the daemon does not answer.

    ``base_url`` None: the environment's daemon, as the ``docker`` CLI finds it
    (``DOCKER_HOST``, ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``, or the local socket).
    Otherwise ``base_url`` and ``tls`` (a ``docker.tls.TLSConfig``) say where; ``where``
    names the daemon in the error.
    """
    cls = _client_class()
    try:
        if base_url is None:
            client = cls.from_env(timeout=int(timeout))
        else:
            client = cls(base_url=base_url, tls=tls or False, timeout=int(timeout))
        client.ping()
    except Exception as exc:
        hint = _unreachable_hint(base_url)
        raise SandboxError(
            f"cannot reach the Docker daemon{where} ({type(exc).__name__}: {exc}); {hint}"
        ) from exc
    return client


def _unreachable_hint(base_url: str | None) -> str:
    """What to fix for a daemon that does not answer; names the ``DOCKER_HOST`` that was used.

    Why: with ``DOCKER_HOST`` set, "set DOCKER_HOST" hid that its own value was the fault.
    """
    if base_url is not None:
        return "is it running there?"
    if env_host := os.environ.get("DOCKER_HOST"):
        return f"start dockerd there or fix DOCKER_HOST={env_host}"
    return "start dockerd or set DOCKER_HOST"
